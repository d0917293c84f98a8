"""Thin Celery wrappers: ids in, logic in jobs.reconcile, jobs.admission
and jobs.checkpointing."""

from celery import shared_task
from django.utils import timezone

from clusters.models import Cluster
from controlplane.lib import locks
from controlplane.lib.tasks import requeue
from jobs import admission, checkpointing, reconcile

from .models import Phase, TrainingJob


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_job(job_id: int) -> None:
    result = reconcile.reconcile_job_locked(job_id, timezone.now())
    requeue(reconcile_job, job_id, result, "job")


@shared_task(acks_late=True, ignore_result=True)
def reconcile_jobs(*job_ids: int) -> None:
    """The fan-out of a pass that woke many jobs at once: the admission pass
    sends one message per hundred jobs it admitted and moves on; the reconcile
    tasks, one per job, are sent from here."""
    for job_id in job_ids:
        reconcile_job.delay(job_id)


@shared_task(acks_late=True, ignore_result=True)
def sweep_jobs() -> None:
    for job_id in reconcile.due_job_ids(timezone.now()):
        reconcile_job.delay(job_id)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def admit_cluster(cluster_id: int) -> None:
    """One admission pass over the cluster's queue. Passes asked for while one
    runs find the lock held and leave: the running pass, or the next sweep,
    sees what they would have seen."""
    with locks.hold(f"admission:{cluster_id}") as acquired:
        if acquired:
            admission.admit(cluster_id, timezone.now())


@shared_task(acks_late=True, ignore_result=True)
def sweep_admission() -> None:
    """The safety net under the on-commit sends: every cluster with a queue."""
    queued = (TrainingJob.objects.filter(phase=Phase.QUEUED)
              .values_list("cluster_id", flat=True).distinct())
    for cluster_id in Cluster.objects.filter(pk__in=queued).values_list("pk", flat=True):
        admit_cluster.delay(cluster_id)


@shared_task(acks_late=True, ignore_result=True)
def sweep_retention() -> None:
    checkpointing.sweep_retention(timezone.now())
