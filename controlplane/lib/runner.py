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
    """One pass over one object; None when another worker holds it."""
    with locks.hold(f"{kind.name}:{object_id}") as acquired:
        if not acquired:
            return None
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
