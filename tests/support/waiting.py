"""Waiting for something to become true, with a deadline, instead of a fixed
sleep that is too short on a loaded machine and too long on an idle one."""

import time


def eventually(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = ""):
    """Poll `predicate` until it returns something true, and return that; fail
    the test once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for "
                                 f"{what or getattr(predicate, '__name__', 'a condition')}")
        time.sleep(interval)
