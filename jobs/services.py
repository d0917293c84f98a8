"""Actions other code (the API, the UI, the CLI) asks of a job, outside HTTP."""

from __future__ import annotations

from django.db import transaction

from accounts.permissions import actor_for, is_operator
from checkpoints.confinement import default_storage_uri
from checkpoints.models import Checkpoint
from controlplane.lib.tasks import RECONCILE_JOB, enqueue_on_commit
from jobs import admission

from .models import TrainingJob


def poke(job: TrainingJob) -> None:
    """Reconcile the job soon (after the surrounding transaction commits)."""
    enqueue_on_commit(RECONCILE_JOB, job.pk)


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
            enqueue_on_commit(RECONCILE_JOB, job.pk)
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
        enqueue_on_commit(RECONCILE_JOB, job.pk)
