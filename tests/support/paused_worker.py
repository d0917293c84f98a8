"""A real Celery worker whose first reconcile pass to reach a launch point
(jobs/signals.py) stops there for good, after writing a marker file, so a
test can SIGKILL the worker in the middle of that pass.

    python -m tests.support.paused_worker <point> <marker file> <celery worker args...>
"""

import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    point, marker, worker_args = argv[0], Path(argv[1]), argv[2:]
    import django

    django.setup()
    from controlplane.celery import app
    from jobs.signals import launch_point

    def stop_here(sender, point: str, **kwargs) -> None:
        if point != wanted or marker.exists():
            return
        marker.write_text("paused")
        while True:  # a pause, not a wait: until the test kills this worker
            time.sleep(60)

    wanted = point
    launch_point.connect(stop_here, weak=False)
    app.worker_main(["worker", *worker_args])


if __name__ == "__main__":
    main(sys.argv[1:])
