"""Error classes shared by reconcilers, providers and storage.

Following kopf and controller-runtime: a temporary error is retried after a
delay, a permanent one stops retrying, anything else retries with backoff.
"""


class RegattaError(Exception):
    pass


class TemporaryError(RegattaError):
    """Worth retrying after `delay` seconds (429, 5xx, timeouts)."""

    def __init__(self, message: str = "", delay: float = 5.0):
        super().__init__(message)
        self.delay = delay


class PermanentError(RegattaError):
    """Retrying will not help (403, 422, a bad setting)."""


class CannotRun(PermanentError):
    """The scheduler says the job can never run as asked (Slurm's "Requested
    node configuration is not available", a workload its controller refuses
    for good): the job ends with the scheduler's words, not a retry loop."""


class IllegalTransition(RegattaError):
    """A state change asked from a state that does not allow it (API: 409)."""

    def __init__(self, kind: str, obj_id, current: str, target: str):
        self.kind, self.obj_id, self.current, self.target = kind, obj_id, current, target
        super().__init__(f"{kind} {obj_id} cannot go from {current} to {target}")


class Refused(RegattaError):
    """An ask the object's present state cannot take, said for people: no
    running attempt to checkpoint, no checkpoint to rerun from (API: 409)."""


class NotAllowed(RegattaError):
    """The person may not ask this of the object (API: 403)."""
