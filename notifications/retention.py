"""The delivery log keeps REGATTA_WEBHOOK_LOG_DAYS of finished deliveries;
one still pending is kept whatever its age (it may yet be sent)."""

from datetime import datetime, timedelta

from django.conf import settings

from .models import Delivery

BATCH = 1000


def prune(now: datetime, max_rows: int = 50 * BATCH) -> int:
    """Delete finished deliveries older than the log keeps, in batches, at
    most `max_rows` a run (the next run takes the rest); returns how many."""
    cutoff = now - timedelta(days=settings.WEBHOOK_LOG_DAYS)
    old = (Delivery.objects.filter(created_at__lt=cutoff)
           .exclude(status=Delivery.Status.PENDING).order_by("id"))
    deleted = 0
    while deleted < max_rows:
        ids = list(old.values_list("pk", flat=True)[:min(BATCH, max_rows - deleted)])
        if not ids:
            break
        deleted += Delivery.objects.filter(pk__in=ids).delete()[0]
    return deleted
