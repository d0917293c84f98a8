"""Thin Celery wrappers: ids in, logic in clusters.reconcile."""

from celery import shared_task
from django.utils import timezone

from controlplane.lib.tasks import requeue

from . import reconcile


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reconcile_cluster(cluster_id: int) -> None:
    result = reconcile.reconcile_cluster_locked(cluster_id, timezone.now())
    requeue(reconcile_cluster, cluster_id, result, "cluster")


@shared_task(acks_late=True, ignore_result=True)
def sweep_clusters() -> None:
    for cluster_id in reconcile.due_cluster_ids(timezone.now()):
        reconcile_cluster.delay(cluster_id)
