"""The one reconcile runner every reconcile task goes through.

It holds the object's lock for the pass and honours the three error classes
(controlplane/lib/errors.py, after kopf and controller-runtime):

- temporary: look again after the error's own delay;
- permanent: retrying will not help, so the object gets a condition, an
  event and its last error, and is not looked at again until something
  changes (a spec change, a report, an operator's action send it again; a
  slow recheck stands in for changes nobody announces);
- anything else: look again with exponential backoff, the count of errors
  in a row kept in the condition.

A pass that succeeds clears the condition. What "a condition, an event and
the last error" means for a kind is the kind's (`Kind.record_error`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

from . import locks, telemetry
from .errors import PermanentError, TemporaryError
from .reconcile import Result

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0
# After a permanent error, the object is looked at again this rarely: a world
# change nobody announces (a bucket policy fixed, a Secret created) still gets
# noticed, without retrying every few seconds.
PERMANENT_RECHECK_S = 3600.0

TEMPORARY, PERMANENT, OTHER = "temporary", "permanent", "other"


@dataclass(frozen=True)
class ReconcileError:
    error_class: str  # temporary | permanent | other
    message: str
    count: int  # errors in a row, this one included
    retry_after: float  # seconds until the next look

    def as_condition(self, now) -> dict:
        return {"error_class": self.error_class, "message": self.message[:1000],
                "count": self.count, "at": now.isoformat(), "retry_after_s": self.retry_after}


class Kind(Protocol):
    """What the runner needs of each kind of object (jobs, clusters)."""

    name: str  # the lock's prefix: "job", "cluster"
    # Whether an ask that finds the object held is kept for after the pass
    # (see `run`): for objects asked for by the changes that concern them,
    # not for those every sweep asks for anyway.
    keeps_asks: bool

    def reconcile(self, object_id: int, now) -> Result: ...

    def errors_in_a_row(self, object_id: int) -> int: ...

    def record_error(self, object_id: int, now, error: ReconcileError) -> None: ...

    def clear_error(self, object_id: int) -> None: ...


def classify(exc: Exception, previous: int) -> ReconcileError:
    """The error's class and when to look again, given `previous` errors in a row."""
    count = previous + 1
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, TemporaryError):
        return ReconcileError(TEMPORARY, message, count, max(0.0, exc.delay))
    if isinstance(exc, PermanentError):
        return ReconcileError(PERMANENT, message, count, PERMANENT_RECHECK_S)
    backoff = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (count - 1))
    return ReconcileError(OTHER, message, count, backoff)


def run(kind: Kind, object_id: int, now) -> Result | None:
    """One pass over one object; None when another worker holds it.

    For a kind that `keeps_asks`, a pass asked for while another worker
    holds the object is not lost: it is noted, and the holder, once it lets
    go, asks for one more at once (`requeue_after` 0). Without that, a
    change that lands during a pass (a job admitted while the pass that
    queued it still held it) waited for the object's next due time, for
    the sweep."""
    name = f"{kind.name}:{object_id}"
    result = None
    with locks.hold(name) as acquired:
        if acquired:
            result = _pass(kind, object_id, now)
    if not acquired:
        if not kind.keeps_asks:
            return None
        locks.mark_dirty(name)
        # The holder may have let go between the first try and the note,
        # and looked for one before it was there: try once more.
        with locks.hold(name) as acquired:
            if not acquired:
                return None
            locks.take_dirty(name)  # this pass is the one asked for
            return _pass(kind, object_id, now)
    if kind.keeps_asks and locks.take_dirty(name):
        return Result.after(0.0, "asked for again during the pass")
    return result


def _pass(kind: Kind, object_id: int, now) -> Result:
    """The pass itself, under the object's lock, with its error classes."""
    started = time.monotonic()
    try:
        result = kind.reconcile(object_id, now)
    except locks.LockLost:
        raise  # `hold` ends the pass: the lock's new holder does the work
    except Exception as exc:  # every class is handled below, none is lost
        error = classify(exc, kind.errors_in_a_row(object_id))
        log.warning("%s %s: %s error #%d: %s (next look in %.0fs)", kind.name, object_id,
                    error.error_class, error.count, error.message, error.retry_after,
                    exc_info=error.error_class == OTHER)
        kind.record_error(object_id, now, error)
        telemetry.count("reconcile_errors", kind=kind.name, error_class=error.error_class)
        return Result.after(error.retry_after, error.message)
    finally:
        telemetry.observe("reconcile_duration_seconds", time.monotonic() - started,
                          kind=kind.name)
    kind.clear_error(object_id)
    return result
