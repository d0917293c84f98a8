"""A job's checkpoints as the job sees them: where they live, which one a
launch resumes from (a corrupt one written on the timeline), which steps
retention must spare, and the retention sweep.

The checkpoints app knows files, manifests and rows; what a checkpoint means
for a job (a restart bound to it, an event on its timeline) is decided here.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Q

from checkpoints import confinement, verification
from checkpoints.models import Checkpoint
from checkpoints.storage import S3Options, apply_retention, open_uri, retention_plan
from controlplane.lib.errors import PermanentError
from jobs.models import JobAttempt, TrainingJob

log = logging.getLogger(__name__)


def job_checkpoint_uri(job) -> str:
    """Where a job's `step-N/` folders live."""
    return job.storage_uri or str(settings.CHECKPOINT_ROOT / f"job-{job.pk}")


def s3_options(cluster) -> S3Options:
    cfg = cluster.config
    return S3Options(region=cfg.region, endpoint_url=cfg.s3_endpoint_url,
                     max_attempts=cfg.s3_max_attempts,
                     multipart_threshold_mb=cfg.s3_multipart_threshold_mb)


def open_job_storage(job):
    """The job's storage, once its folder is checked to be still where its
    name says (a link planted since submission could lead to another team's
    checkpoints: checkpoints/confinement.py); every read then follows no
    link below the storage root (a step folder or a file linked later)."""
    uri = job_checkpoint_uri(job)
    try:
        confinement.require_real_path(uri)
    except confinement.OutsideRoots as exc:
        raise PermanentError(str(exc)) from None
    return open_uri(uri, s3_options(job.cluster), confined_to=confinement.storage_base(uri))


def newest_verified(job, now, at_most: int | None = None, storage=None) -> Checkpoint | None:
    """The checkpoint a launch resumes from; each corrupt one skipped on the
    way is an event on the job's timeline."""
    def corrupt(checkpoint: Checkpoint, reason: str) -> None:
        job.record("CheckpointCorrupt", f"step {checkpoint.step} failed verification: {reason}",
                   evidence={"step": checkpoint.step, "uri": checkpoint.uri, "reason": reason},
                   now=now)

    return verification.newest_verified(job, storage or open_job_storage(job), now,
                                        at_most=at_most, on_corrupt=corrupt)


def abandon_branch(job, step: int, before_attempt: int, now) -> list[int]:
    """A person restarted the job from `step`: the checkpoints past it that
    earlier attempts wrote are on the branch the restart left, so they are
    never resumed from or offered again (a failure of the new gang must not
    fall forward onto them). Returns the steps abandoned."""
    rows = (Checkpoint.objects.filter(job=job, step__gt=step)
            .filter(Q(attempt__isnull=True) | Q(attempt__number__lt=before_attempt)))
    moved = Checkpoint.transition_many(rows, Checkpoint.State.ABANDONED,
                                       reason=f"left by the restart from step {step}")
    steps = sorted(c.step for c in moved)
    if steps:
        job.record("CheckpointsAbandoned",
                   f"steps {', '.join(map(str, steps))} are on the branch the restart from "
                   f"step {step} left", evidence={"steps": steps, "restart_step": step}, now=now)
    return steps


def on_abandoned_branch(job, attempt, step: int) -> bool:
    """Whether a checkpoint an attempt reports now belongs to a branch a
    person's honoured restart left: an older attempt's, past the restart
    step (the old gang's emergency checkpoint arrives after the restart)."""
    honoured = next((c for c in job.conditions or [] if c.get("type") == "RestartFromStep"),
                    None)
    return bool(honoured and attempt.number < honoured["attempt"]
                and step > honoured.get("branch_step", honoured["step"]))


def protected_steps(job) -> set[int]:
    """Steps a restart is bound to: the one a person asked to restart from
    (restart_from_step, or the checkpoint that request resolves to, the newest
    loadable at or below it), the resume point of every attempt still
    preflighting, starting or running, and every step an eval run that has
    not ended has yet to read (jobs/evals/)."""
    steps = set(JobAttempt.objects.filter(job=job, resume_step__isnull=False)
                .exclude(state__in=JobAttempt.ENDED).values_list("resume_step", flat=True))
    steps |= set(TrainingJob.objects.filter(parent=job).exclude(
        phase__in=TrainingJob.TERMINAL).values_list("eval_step", flat=True))
    job.refresh_from_db(fields=["restart_from_step"])
    asked = job.restart_from_step
    if asked is not None:
        steps.add(asked)
        resolved = (Checkpoint.objects.filter(job=job, step__lte=asked,
                                              state__in=Checkpoint.LOADABLE)
                    .order_by("-step").values_list("step", flat=True).first())
        if resolved is not None:
            steps.add(resolved)
    return steps


def prune(job, now, storage=None) -> list[int]:
    """Apply retention to one job and write what it deleted on the timeline."""
    if not retention_plan(job, protected_steps(job))[1]:
        return []
    deleted = apply_retention(job, storage or open_job_storage(job),
                              protect=lambda: protected_steps(job))
    if deleted:
        job.record("CheckpointsDeleted",
                   f"retention deleted steps {', '.join(map(str, deleted))}",
                   evidence={"steps": deleted, "keep_last": job.keep_last,
                             "uri": job_checkpoint_uri(job)}, now=now)
    return deleted


def sweep_retention(now) -> int:
    """Beat's retention sweep (`sweep-checkpoint-retention`, every minute):
    prune every job that has checkpoints, running or ended (keep the newest
    `keep_last`, never the newest verified one nor one a restart is bound to).

    This is the only retention a job launched by the control plane gets: its
    trainer reports each checkpoint and deletes none (docs/trainer.md). So a
    job whose ranks hold GPUs is first brought up to date with its storage:
    a committed folder whose report was lost with its rank gets its row here,
    or it would never be pruned."""
    total = 0
    # An eval run writes no checkpoints: it reads its parent's, whose own
    # retention spares them while it runs.
    jobs = TrainingJob.objects.filter(
        Q(checkpoints__state__in=Checkpoint.LOADABLE) | Q(phase__in=TrainingJob.HOLDS_GPUS)
    ).exclude(kind=TrainingJob.Kind.EVAL).distinct()
    for job in jobs:
        try:
            storage = open_job_storage(job)
            if job.phase in TrainingJob.HOLDS_GPUS:
                verification.register_from_storage(job, storage, now)
            total += len(prune(job, now, storage))
        except Exception as exc:  # one job's storage trouble must not stop the sweep
            log.warning("retention for job %s failed: %s", job.pk, exc)
    return total
