"""A gang the admission pass chose as a victim (jobs/admission/preemption.py): it was
asked to checkpoint now and stop. Wait, at most the cluster's
`preemption_checkpoint_wait_s`, for its checkpoint and its exit; then stop
what is left, end the attempt and send the job back to the queue, first
among its team's jobs of its priority, with a `Preempted` event. It resumes
from that checkpoint; one that could not checkpoint in time resumes from its
newest verified checkpoint and the work lost is booked as `preemption`.

A preemption is not a failure of the job: no restart budget is charged.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Q

from checkpoints.models import Checkpoint
from controlplane.lib.reconcile import Result
from jobs import goodput
from jobs.admission.sharing import EVICTING
from jobs.context import Ctx
from jobs.goodput.models import GoodputEntry
from jobs.models import FailureClass, JobAttempt, Phase


def check(ctx: Ctx, attempt: JobAttempt, status) -> Result | None:
    """None unless the job is being preempted."""
    pending = ctx.condition(EVICTING)
    if pending is None:
        return None
    if pending.get("attempt") != attempt.id:
        # Asked of an attempt that has ended since; the pass asks again if
        # the waiter still needs the room.
        ctx.clear_condition(EVICTING)
        return None
    job, now = ctx.job, ctx.now
    requested_at = datetime.fromtimestamp(pending["requested_at"], tz=UTC)
    # The SDK answers `stop` with an emergency checkpoint, carrying the
    # request id when it saw the request too.
    saved = Checkpoint.objects.filter(job=job, attempt=attempt, state__in=Checkpoint.LOADABLE)
    checkpoint = (saved.filter(Q(request_id=pending["request_id"])
                               | Q(emergency=True, created_at__gte=requested_at))
                  .order_by("-step").first())
    exited = not any(n.running for n in status.nodes) if status.nodes else (
        status.state != "running")
    if checkpoint is None and exited:
        # A stop that came just after a periodic save of the step the gang
        # stopped at: the SDK does not save a step twice, so that save,
        # holding every step the gang made, is the stop's checkpoint.
        checkpoint = saved.filter(step__gte=attempt.last_step).order_by("-step").first()
    waited = (now - requested_at).total_seconds()
    wait_s = float(pending.get("wait_s", ctx.config.preemption_checkpoint_wait_s))
    if not (checkpoint is not None and exited) and waited < wait_s:
        return Result.after(min(1.0, ctx.config.observe_interval_s, wait_s - waited),
                            "preempted: waiting for the checkpoint and the exit")
    return _requeue(ctx, attempt, pending, checkpoint, waited)


def _requeue(ctx: Ctx, attempt: JobAttempt, pending: dict, checkpoint, waited: float) -> Result:
    job, now = ctx.job, ctx.now
    ctx.provider.stop(attempt.provider_ref, grace_s=ctx.config.stop_grace_s)
    by = f"job #{pending['by']}"
    if not attempt.end(JobAttempt.State.STOPPED, now, failure_class=FailureClass.PREEMPTED,
                       failure_reason=f"preempted by {by}"):
        return Result.after(0.5, "attempt already ended")
    if checkpoint is not None:
        resume, lost_s = checkpoint, 0.0
        goodput.book_attempt_end(job, attempt, ended_at=now)
    else:
        resume = (Checkpoint.objects.filter(job=job, state__in=Checkpoint.LOADABLE)
                  .order_by("-step").first())
        lost_s = _lost_seconds(attempt, resume, now)
        goodput.book_attempt_end(job, attempt, ended_at=now, rollback_s=lost_s,
                                 lost_as=GoodputEntry.Category.PREEMPTION,
                                 detail=f"preempted by {by} before a checkpoint")
    step = resume.step if resume is not None else 0
    steps_lost = max(0, attempt.last_step - step)
    saved = (f"checkpoint at step {checkpoint.step}" if checkpoint is not None
             else f"no checkpoint within {waited:.0f}s, resuming from step {step}")
    why = "reclaimed" if pending.get("why") == "reclaim" else "preempted"
    message = f"{why} by {by}: {saved}, {steps_lost} steps lost"
    ctx.set_condition(EVICTING)
    ctx.release_nodes(
        Phase.QUEUED, attempt, reason="Preempted", message=message,
        evidence={"by": pending["by"], "why": pending.get("why"),
                  "checkpoint_step": checkpoint.step if checkpoint is not None else None,
                  "checkpoint_uri": checkpoint.uri if checkpoint is not None else None,
                  "resume_step": step if resume is not None else None,
                  "steps_lost": steps_lost, "seconds_lost": round(lost_s, 3),
                  "waited_s": round(waited, 3)},
        pending_reason=f"{why} by {by}; waiting to be admitted again",
        preempted_at=now, borrowed_gpus=0, borrowed_from={},
    )
    return Result.after(ctx.config.queue_interval_s, message)


def _lost_seconds(attempt: JobAttempt, resume, now) -> float:
    if attempt.first_step_at is None:
        return 0.0
    since = attempt.first_step_at
    if resume is not None and resume.created_at > since:
        since = resume.created_at
    return max(0.0, (now - since).total_seconds())
