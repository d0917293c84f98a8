"""Thin Celery wrappers: ids in, logic in jobs.reconcile."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from controlplane.lib import locks

from . import reconcile


def requeue(task, object_id: int, result, kind: str) -> None:
    """A pass that wants another look sooner than the next sweep gets a
    countdown task; one per object at a time, however many passes asked."""
    if result is None or result.requeue_after is None:
        return
    delay = result.requeue_after
    if delay >= settings.SWEEP_INTERVAL_S:
        return  # the sweep will find it due
    if locks.once_within(f"{kind}:{object_id}", max(delay, 0.05)):
        task.apply_async((object_id,), countdown=delay)


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_job(job_id: int) -> None:
    result = reconcile.reconcile_job_locked(job_id, timezone.now())
    requeue(reconcile_job, job_id, result, "job")


@shared_task(acks_late=True, ignore_result=True)
def sweep_jobs() -> None:
    for job_id in reconcile.due_job_ids(timezone.now()):
        reconcile_job.delay(job_id)
