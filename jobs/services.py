"""What people ask of a job, outside HTTP: the API's views and the UI's form
posts call these, and map what they raise (IllegalTransition and Refused: a
409 or a message; NotAllowed: a 403)."""

from __future__ import annotations

from django.db import transaction

from accounts.permissions import actor_for, is_operator
from checkpoints.confinement import default_storage_uri, link_below_root
from checkpoints.models import Checkpoint
from controlplane.lib.errors import NotAllowed, Refused
from controlplane.lib.tasks import RECONCILE_JOB
from jobs import admission

from .checkpointing import job_checkpoint_uri
from .models import JobAttempt, TrainingJob


def submit_job(spec: dict, user, *, send: bool = True) -> TrainingJob:
    """Create a validated spec's job with its storage and Submitted event;
    its first reconcile is sent once the transaction commits (`send`), or
    left to beat's next sweep."""
    actor = actor_for(user)
    with transaction.atomic():
        job = TrainingJob.objects.create(created_by=user, **spec)
        if not job.storage_uri:
            # In the team's own folder under the cluster's first storage root.
            job.storage_uri = default_storage_uri(job.team.name, job.pk, job.cluster)
            TrainingJob.objects.filter(pk=job.pk).update(storage_uri=job.storage_uri)
        job.record("Submitted", f"submitted by {actor}", actor=actor,
                   evidence={"world_size": job.world_size, "pool": job.pool.name})
        if send:
            RECONCILE_JOB.soon(job.pk)
    return job


def may_rerun(user, job: TrainingJob) -> bool:
    """A rerun spends the team's GPUs anew: the job's owner (who submitted
    it) or an operator decides, not every teammate."""
    return is_operator(user) or (job.created_by_id is not None and job.created_by_id == user.pk)


def can_resume(job: TrainingJob) -> bool:
    """Whether an ended job has any checkpoint a rerun could start from."""
    return Checkpoint.objects.filter(job=job, state__in=Checkpoint.LOADABLE).exists()


def rerun_job(job: TrainingJob, from_step: int, user) -> None:
    """Queue an ended job again from a validated checkpoint step; the cluster
    is asked for an admission pass, since a queued job's own reconcile only
    carries the reason that pass leaves (jobs/reconcile)."""
    with transaction.atomic():
        job.rerun(from_step, actor_for(user))
        admission.request_admission(job.cluster_id)
        RECONCILE_JOB.soon(job.pk)


def cancel(job: TrainingJob, user) -> bool:
    """Ask the reconciler to stop the job. Idempotent: False when it was
    asked already; IllegalTransition once the job has ended."""
    with transaction.atomic():
        asked = job.request_cancel(actor_for(user))
        if asked:
            RECONCILE_JOB.soon(job.pk)
    return asked


def checkpoint_now(job: TrainingJob, user) -> tuple[JobAttempt, str]:
    """Ask the running attempt for a checkpoint at its next step; returns
    the attempt and the request's id."""
    attempt = job.running_attempt()
    if attempt is None:
        raise Refused(f"Job {job.pk} ({job.name}) has no running attempt to checkpoint.")
    return attempt, attempt.request_checkpoint(actor_for(user))


def check_may_restart(job: TrainingJob, user) -> None:
    """Before the step is even read: an ended job runs again only at its
    owner's or an operator's word, and only from a checkpoint it kept."""
    if not job.is_terminal:
        return
    if not may_rerun(user, job):
        raise NotAllowed(f"Only the owner of {job.name} or an operator may rerun it.")
    if not can_resume(job):
        raise Refused(f"Job {job.pk} ({job.name}) has ended ({job.phase}) with no committed or "
                      "verified checkpoint to resume from; submit it again instead.")


def check_restart_step(job: TrainingJob, step: int) -> None:
    """A restart needs a committed or verified checkpoint at `step`, in the
    job's own folder: a step folder that is a symbolic link is some other
    folder's (checkpoints/confinement.py)."""
    if not Checkpoint.objects.filter(job=job, step=step,
                                     state__in=Checkpoint.LOADABLE).exists():
        raise Refused(f"Job {job.pk} has no committed or verified checkpoint at step {step}.")
    link = link_below_root(f"{job_checkpoint_uri(job).rstrip('/')}/step-{step}")
    if link:
        raise Refused(f"{link} is a symbolic link: step {step} is not this job's to restart "
                      "from.")


def restart(job: TrainingJob, from_step: int, user) -> str:
    """Restart a live job's gang from a step it has a checkpoint at, or run
    an ended one again from it; says which ("restart" or "rerun")."""
    check_may_restart(job, user)
    check_restart_step(job, from_step)
    if job.is_terminal:
        rerun_job(job, from_step, user)
        return "rerun"
    with transaction.atomic():
        job.request_restart(from_step, actor_for(user))
        RECONCILE_JOB.soon(job.pk)
    return "restart"
