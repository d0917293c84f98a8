"""Ending a job: success (final checkpoint, exported model, nodes released)
and cancellation (ranks stopped, nodes released)."""

from __future__ import annotations

from checkpoints.export import export_final
from checkpoints.verification import newest_verified
from controlplane.lib.reconcile import Result

from .. import goodput
from ..models import JobAttempt, Phase
from .common import Ctx


def _release(ctx: Ctx, attempt: JobAttempt | None) -> None:
    nodes = list(attempt.placements.values_list("node__name", flat=True)) if attempt else []
    ctx.job.record("NodesReleased", "the job's nodes are free" if nodes else "no nodes held",
                   attempt=attempt, now=ctx.now, evidence={"nodes": nodes})


def succeed(ctx: Ctx, attempt: JobAttempt) -> Result:
    job, now = ctx.job, ctx.now
    checkpoint = newest_verified(job, now)
    if checkpoint is not None:
        artifact = export_final(job, checkpoint, now)
    changed = JobAttempt.objects.filter(pk=attempt.pk).exclude(
        state__in=JobAttempt.ENDED
    ).update(state=JobAttempt.State.SUCCEEDED, ended_at=now, exit_code=0)
    if changed:
        attempt.refresh_from_db()
        goodput.book_attempt_end(job, attempt, ended_at=now)
    if checkpoint is not None:
        job.record("ModelExported", f"{artifact.name} v{artifact.version}", attempt=attempt,
                   now=now, evidence={"uri": artifact.uri, "sha256": artifact.sha256,
                                      "bytes": artifact.bytes, "step": checkpoint.step})
    else:
        job.record("NoFinalCheckpoint", "the job ended without a verified checkpoint",
                   attempt=attempt, now=now)
    final_step = checkpoint.step if checkpoint else attempt.last_step
    job.transition(Phase.SUCCEEDED, reason="Succeeded", attempt=attempt, now=now,
                   message=f"finished at step {final_step}", finished_at=now,
                   pending_reason="", current_step=final_step)
    _release(ctx, attempt)
    return Result.done("succeeded")


def cancel(ctx: Ctx) -> Result:
    job, now = ctx.job, ctx.now
    attempt = ctx.live_attempt()
    if attempt is not None:
        if attempt.provider_ref:
            ctx.provider.stop(attempt.provider_ref, grace_s=ctx.setting("stop_grace_s"))
        changed = JobAttempt.objects.filter(pk=attempt.pk).exclude(
            state__in=JobAttempt.ENDED
        ).update(state=JobAttempt.State.STOPPED, ended_at=now, failure_reason="cancelled")
        if changed:
            attempt.refresh_from_db()
            goodput.book_attempt_end(job, attempt, ended_at=now)
    job.transition(Phase.CANCELLED, reason="Cancelled", attempt=attempt, now=now,
                   message="ranks stopped" if attempt else "cancelled before launch",
                   finished_at=now, pending_reason="")
    _release(ctx, attempt)
    return Result.done("cancelled")
