"""The fast path and the safety net with a real Celery worker on the real
broker: an event's delivery is sent once its transaction commits, and one
whose task was lost is sent by the beat sweep."""

import time

import pytest
from celery.contrib.testing.worker import start_worker
from django.utils import timezone

from controlplane.celery import app
from jobs.models import Phase
from notifications import payloads, signing
from notifications.models import Delivery, Webhook
from notifications.tasks import sweep_deliveries
from tests.api_factories import make_job
from tests.support.waiting import eventually

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]


def test_a_committed_failure_reaches_the_receiver_through_a_real_worker(
        team, cluster, owner, receiver, loopback_allowed):
    webhook = Webhook.objects.create(team=team, url=receiver.url, events=["job.failed"])
    job = make_job(team, cluster, owner, phase="running")
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        job.transition(Phase.FAILED, reason="Failed", message="boom", now=timezone.now())
        eventually(lambda: Delivery.objects.filter(status="succeeded").exists(), timeout=30,
                   interval=0.1, what="a delivery succeeded")
    [got] = receiver.received
    assert signing.verify(webhook.secret, got.headers, got.body, now=time.time())
    assert got.body == payloads.body(Delivery.objects.get().payload)


def test_a_delivery_whose_task_was_lost_is_sent_by_the_sweep(team, receiver, loopback_allowed):
    webhook = Webhook.objects.create(team=team, url=receiver.url, events=["job.failed"])
    # Written with no task sent: as if the broker was down when it committed.
    lost = Delivery.objects.create(webhook=webhook, event_type="webhook.ping",
                                   payload={"type": "webhook.ping"},
                                   next_attempt_at=timezone.now())
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        sweep_deliveries.delay()
        eventually(lambda: Delivery.objects.get(pk=lost.pk).status == "succeeded", timeout=30,
                   interval=0.1, what="the lost delivery succeeded")
    assert len(receiver.received) == 1
