"""A task for the broker-restart test: it holds its message unacknowledged
(acks_late) for a while, leaving files that say when it started and ended."""

import time
from pathlib import Path

from controlplane.celery import app


@app.task(name="tests.support.broker_tasks.hold", acks_late=True)
def hold(folder: str, tag: str, seconds: float) -> None:
    Path(folder, f"{tag}.started").touch()
    time.sleep(seconds)  # a task that runs a while, on purpose
    with open(Path(folder, f"{tag}.done"), "a") as done:
        done.write("ran\n")
