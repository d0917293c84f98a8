"""A gang the provider says is held back before it started (Unschedulable,
a Kueue queue, a Volcano PodGroup): the job shows why as its pending reason
and one event per distinct cause, and is looked at again each observe
interval instead of being relaunched as a hang once the start-up deadline
passes (detect.py counts that deadline from the end of the wait)."""

from __future__ import annotations

from clusters.models import Node
from controlplane.lib.reconcile import Result
from jobs.context import Ctx
from jobs.recovery.budgets import SCHEDULER_HOLD
from jobs.recovery.detect import START_WAIT, Failure

from ..models import FailureClass, JobAttempt, TrainingJob

EVENT = "WaitingToStart"


def note(ctx: Ctx, attempt: JobAttempt, waits) -> Result:
    job, now = ctx.job, ctx.now
    text = "; ".join(w.describe() for w in waits)
    reasons = sorted({w.reason for w in waits})
    previous = ctx.condition(START_WAIT)
    ongoing = (previous is not None and previous.get("attempt") == attempt.id
               and previous.get("active"))
    # The scheduler rewrites its message as nodes come and go ("0/3 nodes
    # are available ..."); a new event only when the cause itself changes.
    if not ongoing or previous.get("reasons") != reasons:
        job.record(EVENT, f"attempt {attempt.number}: {text}"[:1000], attempt=attempt, now=now,
                   evidence={"issues": [{"reason": w.reason, "message": w.message,
                                         "node_rank": w.node_rank} for w in waits]})
    since = previous["since"] if ongoing else now.timestamp()
    ctx.set_condition(START_WAIT, attempt=attempt.id, active=True, reasons=reasons,
                      since=since, last=now.timestamp())
    reason = f"attempt {attempt.number} waiting to start: {text}"[:500]
    if job.pending_reason != reason:
        TrainingJob.objects.filter(pk=job.pk).update(pending_reason=reason)
        job.pending_reason = reason
    return Result.after(ctx.config.observe_interval_s, reason[:200])


def on_held_nodes(ctx: Ctx, attempt: JobAttempt) -> Failure | None:
    """A gang still waiting to start on a node that its scheduler's admin
    has taken out since it was placed (a Slurm drain leaves the attempt
    PENDING with ReqNodeNotAvail until the admin resumes it): moved to
    other nodes now rather than waiting on it. The node's, not the job's,
    and no fault of the node either."""
    held = list(Node.objects.filter(
        pk__in=attempt.placements.values("node_id")).exclude(admin_hold="")
        .values_list("name", "admin_hold"))
    if not held:
        return None
    names = [name for name, _ in held]
    return Failure(
        FailureClass.PREEMPTED,
        f"{', '.join(names)} taken out by the scheduler's admin before the attempt started "
        f"({held[0][1]}): relaunching on other nodes",
        nodes=names, evidence={"source": SCHEDULER_HOLD, "holds": dict(held)}, replace=False)


def clear(ctx: Ctx, attempt: JobAttempt) -> None:
    """The wait is over: drop the pending reason. The condition stays (not
    active) because detect.py counts the start-up deadline from its end."""
    previous = ctx.condition(START_WAIT)
    if previous is None or not previous.get("active") or previous.get("attempt") != attempt.id:
        return
    ctx.set_condition(START_WAIT, **{**{k: v for k, v in previous.items() if k != "type"},
                                     "active": False, "last": ctx.now.timestamp()})
    TrainingJob.objects.filter(pk=ctx.job.pk).update(pending_reason="")
    ctx.job.pending_reason = ""
