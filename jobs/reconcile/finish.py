"""Ending a job: success (exported model, nodes released) and cancellation
(ranks stopped, nodes released).

A job that promised its final checkpoint (the built-in trainer's default)
succeeds only with that step's checkpoint verified and exported. Ranks that
exit 0 without leaving it (a save that never committed, a checkpoint that
fails verification) are a transient failure with the evidence on the
timeline: the job resumes from its newest verified checkpoint to redo the
remaining steps, within its transient budget. A program that promised only
its exit codes (the default with an entrypoint) succeeds when every rank
exits 0.
"""

from __future__ import annotations

from checkpoints.export import export_final, has_model
from checkpoints.models import Checkpoint
from controlplane.lib.reconcile import Result
from jobs import evals, goodput
from jobs.context import Ctx
from jobs.recovery.detect import Failure
from jobs.recovery.handle import handle

from ..checkpointing import newest_verified, open_job_storage
from ..models import FailureClass, JobAttempt, JobEvent, Phase, TrainingJob


def final_step(job, attempt: JobAttempt) -> int:
    """The step the run ends at: the trainer's `max_steps` (its default when
    the built-in trainer runs without one); for a program of the job's own
    without it, the step its finished event or its heartbeats reported."""
    hyper = job.hyperparameters or {}
    if hyper.get("max_steps") is not None:
        return int(hyper["max_steps"])
    if not job.entrypoint:
        from trainer.config import TrainerConfig

        return TrainerConfig().max_steps
    finished = (JobEvent.objects.filter(job=job, attempt=attempt, kind="TrainerFinished")
                .order_by("-id").first())
    reported = (finished.evidence or {}).get("step") if finished else None
    return int(reported) if isinstance(reported, int) else attempt.last_step


def succeed(ctx: Ctx, attempt: JobAttempt) -> Result:
    """Every rank exited 0. A job that promised its final checkpoint
    (`completion: checkpoint`, the built-in trainer's default) succeeds only
    with it verified; one that promised only its exit codes (a program's
    default) succeeds now, and its newest verified checkpoint, if it left
    any, is exported."""
    job, now = ctx.job, ctx.now
    if job.is_eval:
        return _succeed_eval(ctx, attempt)
    storage = open_job_storage(job)
    checkpoint = newest_verified(job, now, storage=storage)
    if job.completion == TrainingJob.Completion.CHECKPOINT:
        target = final_step(job, attempt)
        if checkpoint is None or checkpoint.step < target:
            return _final_checkpoint_missing(ctx, attempt, target, checkpoint)
        if not job.entrypoint and not has_model(storage, checkpoint.step):
            return _final_model_missing(ctx, attempt, checkpoint)
    if checkpoint is not None:
        export(ctx, attempt, checkpoint, storage)
    step = max(attempt.last_step, checkpoint.step if checkpoint is not None else 0)
    if attempt.end(JobAttempt.State.SUCCEEDED, now, exit_code=0):
        goodput.book_attempt_end(job, attempt, ended_at=now)
    ctx.release_nodes(Phase.SUCCEEDED, attempt, reason="Succeeded",
                      message=f"finished at step {step}" if step else "every rank exited 0",
                      finished_at=now, pending_reason="", current_step=step,
                      evidence={"completion": job.completion, "step": step,
                                "checkpoint_step": checkpoint.step if checkpoint else None})
    return Result.done("succeeded")


def _succeed_eval(ctx: Ctx, attempt: JobAttempt) -> Result:
    """An eval run's ranks exited 0: what it reported at its step is kept
    on the run, where its parent's chart reads it (jobs/evals/)."""
    job, now = ctx.job, ctx.now
    result = evals.result_of(job, attempt)
    if attempt.end(JobAttempt.State.SUCCEEDED, now, exit_code=0):
        goodput.book_attempt_end(job, attempt, ended_at=now)
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(result["metrics"].items()))
    ctx.release_nodes(Phase.SUCCEEDED, attempt, reason="Succeeded",
                      message=f"evaluated step {job.eval_step}: "
                              f"{metrics or 'no metrics reported'}",
                      finished_at=now, pending_reason="", current_step=job.eval_step,
                      eval_result=result, evidence={"step": job.eval_step, **result["metrics"]})
    return Result.done("evaluated")


def export(ctx: Ctx, attempt: JobAttempt, checkpoint: Checkpoint, storage):
    """The final checkpoint into the registry. A failure is the job's event
    with its message: the run itself succeeded, and its checkpoint stays."""
    job, now = ctx.job, ctx.now
    try:
        artifact = export_final(job, checkpoint, storage, now)
    except Exception as exc:  # whatever broke, the timeline says what
        job.record("ExportFailed", f"step {checkpoint.step} was not exported: {exc}"[:1000],
                   attempt=attempt, now=now,
                   evidence={"step": checkpoint.step, "uri": checkpoint.uri,
                             "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return None
    job.record("ModelExported", f"{artifact.name} v{artifact.version}", attempt=attempt,
               now=now, evidence={"uri": artifact.uri, "sha256": artifact.sha256,
                                  "bytes": artifact.bytes, "step": checkpoint.step,
                                  "format": artifact.format})
    return artifact


def _final_checkpoint_missing(ctx: Ctx, attempt: JobAttempt, target: int,
                              newest: Checkpoint | None) -> Result:
    job, now = ctx.job, ctx.now
    unusable = list(
        Checkpoint.objects.filter(job=job, step__gte=target)
        .values("step", "state", "state_reason", "uri")
    )
    why = (f"its checkpoint at step {target} failed verification" if unusable
           else f"no checkpoint of step {target} was committed")
    fallback = f"step {newest.step}" if newest is not None else "the start"
    reason = f"the ranks exited 0 but {why}; redoing the steps from {fallback}"
    evidence = {"final_step": target, "last_step": attempt.last_step,
                "newest_verified_step": newest.step if newest is not None else None,
                "unusable": unusable}
    job.record("FinalCheckpointMissing", reason, attempt=attempt, now=now, evidence=evidence)
    return handle(ctx, attempt, Failure(FailureClass.TRANSIENT, reason, exit_code=0,
                                        evidence=evidence, replace=False))


def _final_model_missing(ctx: Ctx, attempt: JobAttempt, final: Checkpoint) -> Result:
    """The built-in trainer's final checkpoint has no `export/` model (an
    emergency checkpoint at the last step, by a trainer that predates the
    rule): the job's artifact is always the model, never a raw DCP folder,
    so the ranks resume at that step, where a finish saves it again with
    the model (worker_image/regatta/run.py, `checkpoint(..., export=)`)."""
    reason = (f"the ranks exited 0 but the final checkpoint (step {final.step}) has no "
              "exported model; resuming at it to export the model")
    evidence = {"step": final.step, "uri": final.uri, "emergency": final.emergency}
    ctx.job.record("FinalModelMissing", reason, attempt=attempt, now=ctx.now, evidence=evidence)
    return handle(ctx, attempt, Failure(FailureClass.TRANSIENT, reason, exit_code=0,
                                        evidence=evidence, replace=False))


def cancel(ctx: Ctx) -> Result:
    job, now = ctx.job, ctx.now
    attempt = ctx.live_attempt()
    if attempt is not None:
        if attempt.provider_ref:
            ctx.provider.stop(attempt.provider_ref, grace_s=ctx.config.stop_grace_s)
        if attempt.end(JobAttempt.State.STOPPED, now, failure_reason="cancelled"):
            goodput.book_attempt_end(job, attempt, ended_at=now)
    ctx.release_nodes(Phase.CANCELLED, attempt, reason="Cancelled",
                      message="ranks stopped" if attempt else "cancelled before launch",
                      finished_at=now, pending_reason="")
    evals.cancel_live(job, "reconciler", now)
    return Result.done("cancelled")
