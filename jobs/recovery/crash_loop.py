"""A crash loop is the job's, and it stops.

A program with a deterministic bug fails the same way on every attempt, on
whichever nodes it runs: relaunching it forever spends the fleet, and
blaming its nodes retires healthy machines. After `crash_loop_failures`
failures in a row with the same signature (class, how the process ended,
the program's error line: signature.py) and no progress past the step of
the first of them, the job ends `failed` with that error line and the lines
around it, found in the log, so its owner sees their own traceback.

A failure with another signature, or one after the job got further than
where the loop began, starts the count again: a long run that is killed
by the OOM killer once a day is no crash loop.

Pure functions over the job's fields: handle.py writes what they return.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.models import FailureClass

from .signature import UserError, signature

# The key in `restart_marks` that remembers the current run of failures.
MARK = "crash_loop"
# A preemption (a notice, a drain, a gang scheduler taking the attempt
# back) and a failure pinned to a node by the fleet's own evidence are not
# the program's: they neither count nor break a run.
NODE_CLASSES = (FailureClass.HARDWARE, FailureClass.PREEMPTED)


@dataclass(frozen=True)
class Run:
    """The run of same-signature failures, this one included."""

    signature: str
    count: int
    step: int  # the furthest step the job had reached when the run began
    nodes: tuple[str, ...]  # every node the run's failures happened on
    attempts: tuple[int, ...]

    def as_mark(self) -> dict:
        return {"signature": self.signature, "count": self.count, "step": self.step,
                "nodes": list(self.nodes), "attempts": list(self.attempts)}

    @property
    def elsewhere(self) -> bool:
        """The same failure on more than one node: the program's."""
        return len(self.nodes) > 1


def signature_of(failure) -> str:
    """The failure's signature (signature.py): a hang, or a process that
    ended with its exit and the program's error line."""
    error = failure.evidence.get("error") or {}
    line = UserError(line=error["line"]) if error.get("line") else None
    kind = "hang" if failure.cls == FailureClass.HANG else "ended"
    return signature(kind, failure.exit_code, line)


def previous(job) -> Run | None:
    mark = (job.restart_marks or {}).get(MARK)
    if not mark:
        return None
    return Run(mark["signature"], int(mark["count"]), int(mark.get("step", 0)),
               tuple(mark.get("nodes") or ()), tuple(mark.get("attempts") or ()))


def counts(failure) -> bool:
    return failure.cls not in NODE_CLASSES


def extend(job, attempt, failure, signature: str) -> Run | None:
    """The run this failure belongs to; None for a failure that is the
    node's (it leaves the run as it was)."""
    if not counts(failure):
        return None
    before = previous(job)
    reached = max(int(attempt.last_step or 0), 0)
    margin = max(1, int(job.effective_checkpoint_every or 1))
    same = (before is not None and before.signature == signature
            and reached <= before.step + margin)
    nodes = tuple(sorted({*failure.nodes, *(before.nodes if same else ())}))
    attempts = (*(before.attempts if same else ()), attempt.number)
    return Run(signature, before.count + 1 if same else 1,
               before.step if same else reached, nodes, attempts[-10:])


def seen_on_other_nodes(job, signature: str, nodes) -> bool:
    """Whether the failure the job had just before this one had the same
    signature on other nodes than `nodes`."""
    before = previous(job)
    return (before is not None and before.signature == signature
            and bool(set(before.nodes) - set(nodes)))
