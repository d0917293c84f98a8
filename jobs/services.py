"""Actions other code (the API, the UI, the CLI) asks of a job, outside HTTP."""

from __future__ import annotations

from django.db import transaction

from accounts.permissions import actor_for
from checkpoints.confinement import default_storage_uri
from controlplane.lib.tasks import RECONCILE_JOB, enqueue_on_commit

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
