from datetime import timedelta

import pytest
from django.utils import timezone

from notifications import retention
from notifications.models import Delivery, Webhook

pytestmark = pytest.mark.django_db


def test_finished_deliveries_leave_the_log_after_its_days_and_pending_ones_stay(team,
                                                                                settings):
    settings.WEBHOOK_LOG_DAYS = 30
    now = timezone.now()
    hook = Webhook.objects.create(team=team, url="https://hooks.example.com/x")

    def row(status, days_ago):
        return Delivery.objects.create(webhook=hook, event_type="webhook.ping", payload={},
                                       status=status, created_at=now - timedelta(days=days_ago))

    old = [row("succeeded", 31), row("failed", 40)]
    kept = [row("pending", 90), row("succeeded", 29), row("failed", 1)]
    assert retention.prune(now) == len(old)
    assert set(Delivery.objects.values_list("pk", flat=True)) == {d.pk for d in kept}


def test_one_run_deletes_at_most_its_bound(team, settings):
    settings.WEBHOOK_LOG_DAYS = 1
    hook = Webhook.objects.create(team=team, url="https://hooks.example.com/x")
    long_ago = timezone.now() - timedelta(days=5)
    Delivery.objects.bulk_create([
        Delivery(webhook=hook, event_type="webhook.ping", payload={}, status="succeeded",
                 created_at=long_ago) for _ in range(5)])
    assert retention.prune(timezone.now(), max_rows=3) == 3
    assert retention.prune(timezone.now(), max_rows=3) == 2
    assert not Delivery.objects.exists()
