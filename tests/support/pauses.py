"""Stopping a reconcile pass at one of its launch points (jobs/signals.py)
until the test lets it go, so the test can act while the pass is inside it:
take its lock away, look at the lock, or kill the worker running it."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from jobs.signals import launch_point


class Pause:
    def __init__(self, point: str, timeout_s: float = 60.0):
        self.point, self.timeout_s = point, timeout_s
        self.reached = threading.Event()
        self.resume = threading.Event()
        self._taken = False

    def __call__(self, sender, point: str, **kwargs) -> None:
        if point != self.point or self._taken:
            return
        self._taken = True  # the first pass to get here stops; later ones go on
        self.reached.set()
        if not self.resume.wait(self.timeout_s):
            raise AssertionError(f"the test never let the pass go on from {point!r}")

    def wait_reached(self, timeout_s: float = 30.0) -> None:
        assert self.reached.wait(timeout_s), f"no pass reached {self.point!r}"


@contextmanager
def pause_at(point: str):
    """Within the block, the first pass that reaches `point` waits there until
    `pause.resume.set()` (set on leaving the block in any case)."""
    pause = Pause(point)
    launch_point.connect(pause, weak=False)
    try:
        yield pause
    finally:
        pause.resume.set()
        launch_point.disconnect(pause)
