"""Restart budgets that forgive the fleet (docs/fleet.md, "Restart budgets").

Two rules decide whether a failure spends the job's budget for its class:

1. A window of progress: a class's spent count starts again once the job has
   advanced `budget_reset_steps` steps or `budget_reset_minutes` minutes since
   that class's last failure, so a week-long run is not failed by five node
   faults spread over five days.
2. A failure pinned to nodes (hardware, a spot notice, a drain, a stop of the
   control plane: a failure with `nodes` of class hardware, preempted or hang)
   is the node's, charged to its reliability record, not to the job. Except
   when the job keeps failing on fresh nodes with nothing from the node side
   to confirm the fault (no health event, no notice): FRESH_NODE_STREAK such
   failures in a row, each on nodes that never failed before, make the job the
   likely cause, and from then on they are charged to it.

Pure functions over the job's fields: handle.py writes what they return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from jobs.models import DEFAULT_RESTART_BUDGETS, FailureClass

# Classes whose failure can be the node's rather than the job's.
NODE_CLASSES = (FailureClass.HARDWARE, FailureClass.PREEMPTED, FailureClass.HANG)
# The `source` of a preemption by the cluster's gang scheduler (detect.py).
GANG_SCHEDULER = "gang_scheduler"
# The `source` of a gang moved off a node its scheduler's admin took out
# before it started (waiting.py): the node's, confirmed by the scheduler.
SCHEDULER_HOLD = "scheduler_hold"
# Unconfirmed node failures in a row, each on nodes with no failure before,
# after which the job is taken to be the cause.
FRESH_NODE_STREAK = 3
# The key in `restart_marks` that keeps that streak.
STREAK = "fresh_nodes"


@dataclass
class Charge:
    """What one failure does to the books."""

    cls: str
    charged_to_job: bool
    spent: dict = field(default_factory=dict)  # the new budget_spent
    marks: dict = field(default_factory=dict)  # the new restart_marks
    budget: int = 0
    reset: bool = False  # the class's window had passed: its count started again
    why: str = ""  # why it was (not) charged, for the Restarting event

    @property
    def exhausted(self) -> bool:
        return self.charged_to_job and self.spent.get(self.cls, 0) > self.budget


def budgets_of(job) -> dict:
    return {**DEFAULT_RESTART_BUDGETS, **(job.restart_budgets or {})}


def window_passed(job, mark: dict | None, now: datetime) -> bool:
    """Whether the job advanced far enough since `mark` (a failure's step and
    time) for the budget to forgive it; 0 turns that half of the window off."""
    if not mark:
        return False
    steps, minutes = job.budget_reset_steps, job.budget_reset_minutes
    if steps and job.current_step - int(mark.get("step", 0)) >= steps:
        return True
    return bool(minutes) and now.timestamp() - float(mark.get("at", 0)) >= minutes * 60


def spent_now(job, now: datetime) -> dict:
    """The spent count per class as the next failure would see it: a class
    whose window has passed shows 0 (what the UI and CLI show)."""
    marks = job.restart_marks or {}
    return {cls: 0 if window_passed(job, marks.get(cls), now) else n
            for cls, n in (job.budget_spent or {}).items()}


def summary(job, now: datetime) -> dict:
    """{class: {spent, budget, in_all}}: what the API, the job page and
    `regatta show` show."""
    spent = spent_now(job, now)
    counts = job.restart_counts or {}
    return {cls: {"spent": int(spent.get(cls, 0)), "budget": int(budget),
                  "in_all": int(counts.get(cls, 0))}
            for cls, budget in budgets_of(job).items()}


def is_pinned(failure) -> bool:
    return failure.cls in NODE_CLASSES and bool(failure.nodes)


def node_confirmed(failure) -> bool:
    """The fleet itself said the node was at fault: a health event (XID, ECC,
    a lost node the provider reported), or a spot notice or drain the
    control plane acted on (jobs/reconcile/drain.py names its `source`).
    A rank killed by a signal, a hung rank, or ranks exiting 83 with no
    notice (a stop of the control plane, or a program that exits 83 by
    itself) may be the job's own doing: forgiven, but not forever."""
    if failure.cls == FailureClass.PREEMPTED and failure.evidence.get("source"):
        return True
    return bool(failure.health_event_ids)


def charge(job, failure, *, fresh: bool, now: datetime) -> Charge:
    """Decide who pays for `failure`. fresh: every node it is pinned to had
    no failure on record before it."""
    cls = failure.cls
    spent = dict(job.budget_spent or {})
    marks = dict(job.restart_marks or {})
    reset = window_passed(job, marks.get(cls), now)
    if reset:
        spent[cls] = 0
    here = {"step": job.current_step, "at": now.timestamp()}
    marks[cls] = here
    charged, why = _who_pays(job, failure, fresh, marks, now, here)
    if charged:
        spent[cls] = spent.get(cls, 0) + 1
    return Charge(cls, charged, spent, marks, int(budgets_of(job).get(cls, 0)), reset, why)


def _who_pays(job, failure, fresh: bool, marks: dict, now, here: dict) -> tuple[bool, str]:
    if failure.cls == FailureClass.PREEMPTED and failure.evidence.get("source") == GANG_SCHEDULER:
        # Kueue took the attempt back for another workload (or an operator
        # deactivated it there): neither the job's doing nor a node's, and
        # Kueue paces its own re-admission.
        return False, "taken back by the gang scheduler: charged to no one"
    if not is_pinned(failure):
        return True, "a failure of the job"
    if node_confirmed(failure):
        return False, "the node's fault, confirmed by the fleet: charged to the node"
    streak = marks.get(STREAK) or {}
    count = 0 if window_passed(job, streak, now) else int(streak.get("count", 0))
    count = count + 1 if fresh else 0
    marks[STREAK] = {**here, "count": count}
    if count >= FRESH_NODE_STREAK:
        return True, (f"{count} failures in a row on nodes that never failed before: "
                      "the job is the likely cause")
    return False, "pinned to a node: charged to the node"
