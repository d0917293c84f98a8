from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    """What one reconcile pass asks for next: look again after `requeue_after`
    seconds, or not at all (None) until something changes."""

    requeue_after: float | None = None
    note: str = ""

    @classmethod
    def done(cls, note: str = "") -> "Result":
        return cls(None, note)

    @classmethod
    def after(cls, seconds: float, note: str = "") -> "Result":
        return cls(max(0.0, seconds), note)
