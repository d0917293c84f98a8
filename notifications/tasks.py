"""Thin Celery wrappers: ids in, logic in notifications.delivery."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from controlplane.lib import locks

from . import delivery, retention


@shared_task(acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver_webhook(delivery_id: int) -> None:
    delivery.deliver(delivery_id, timezone.now())


@shared_task(acks_late=True, ignore_result=True)
def sweep_deliveries() -> None:
    """The safety net under the on-commit sends, and the only sender of
    retries (a countdown task of hours would outlive the broker's visibility
    timeout and be handed out twice)."""
    for delivery_id in delivery.due_ids(timezone.now()):
        # One send per delivery per interval, however long the queue: a
        # worker busy elsewhere does not find the same id queued many times.
        if locks.once_within(f"webhook-delivery:{delivery_id}", settings.SWEEP_INTERVAL_S):
            deliver_webhook.delay(delivery_id)


@shared_task(acks_late=True, ignore_result=True)
def prune_deliveries() -> None:
    retention.prune(timezone.now())
