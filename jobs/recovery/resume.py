"""Resume: the checkpoint a launch starts from, and what going back to it
cost (the last act of recovery: jobs/recovery/__init__.py).

The newest checkpoint whose files verify against its manifest, unless a
person asked for a step (restart_from_step, honoured once per generation),
and never one of the attempt's own (a pass that died after launching it
left its ranks training and checkpointing).
"""

from __future__ import annotations

from django.db.models import Min

from checkpoints.models import Checkpoint
from jobs import evals, goodput
from jobs.checkpointing import newest_verified
from jobs.context import Ctx
from jobs.models import JobAttempt


def checkpoint_for(ctx: Ctx, attempt: JobAttempt):
    """(checkpoint or None, whether a person's restart_from_step was used)."""
    job = ctx.job
    if job.is_eval:
        # Exactly the parent's step it evaluates, every attempt.
        return evals.source_checkpoint(job), False
    asked = job.restart_from_step
    honoured = (ctx.condition("RestartFromStep") or {}).get("generation")
    if asked is not None and honoured != job.generation:
        return newest_verified(job, ctx.now, at_most=_below_own(attempt, asked)), True
    return newest_verified(job, ctx.now, at_most=_below_own(attempt, None)), False


def _below_own(attempt: JobAttempt, at_most: int | None) -> int | None:
    """Cap the resume point below the attempt's own checkpoints: when a pass
    died after launching it, its ranks went on training and checkpointing,
    and the pass that adopts them must not record that the attempt resumed
    from its own work."""
    own = Checkpoint.objects.filter(attempt=attempt).aggregate(first=Min("step"))["first"]
    if own is None:
        return at_most
    return own - 1 if at_most is None else min(at_most, own - 1)


def record(ctx: Ctx, attempt: JobAttempt, checkpoint, by_person: bool) -> None:
    """The resume on the job's timeline, with what it cost: the steps and
    seconds lost since the checkpoint it resumed from. The previous attempt's
    rollback line, booked when its failure was handled, is lowered to the
    same figures where a hand-over recorded since made the loss smaller."""
    previous = (JobAttempt.objects.filter(job=ctx.job, number__lt=attempt.number)
                .exclude(first_step_at=None).order_by("-number").first())
    steps_lost = max(0, previous.last_step - checkpoint.step) if previous else 0
    seconds_lost = 0.0
    if previous is not None and previous.ended_at is not None:
        since = max(checkpoint.created_at, previous.first_step_at)
        seconds_lost = max(0.0, (previous.ended_at - since).total_seconds())
        goodput.revise_rollback(
            ctx.job, previous, seconds_lost=seconds_lost,
            detail=f"rolled back to step {checkpoint.step}: {steps_lost} steps lost")
    ctx.job.record(
        "ResumedFromCheckpoint",
        f"resuming from step {checkpoint.step}" + (" (asked by a person)" if by_person else ""),
        attempt=attempt, now=ctx.now,
        evidence={"step": checkpoint.step, "uri": checkpoint.uri, "steps_lost": steps_lost,
                  "seconds_lost": round(seconds_lost, 3), "requested": by_person},
    )
