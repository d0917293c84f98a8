"""Deliveries against a real HTTP server on loopback: signed, retried with
backoff, given up on, never sent where they must not go."""

import json
import random
from datetime import timedelta

import pytest
import standardwebhooks
from django.utils import timezone

from notifications import delivery, signing
from notifications.events import EventType
from notifications.models import Delivery, Webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def webhook(team, receiver, loopback_allowed):
    return Webhook.objects.create(team=team, url=receiver.url, events=["job.succeeded"])


def test_a_delivery_is_signed_so_the_documented_recipe_and_a_standard_library_verify_it(
        webhook, receiver):
    now = timezone.now()
    sent = delivery.ping(webhook, now)
    done = delivery.deliver(sent.pk, now)
    assert done.status == Delivery.Status.SUCCEEDED and done.response_code == 200
    [got] = receiver.received
    assert got.headers["webhook-id"] == f"msg_{sent.pk}"
    assert got.headers["X-Regatta-Event"] == "webhook.ping"
    assert got.headers["Content-Type"] == "application/json"
    assert json.loads(got.body) == done.payload
    # The recipe in docs/notifications.md, and an independent implementation.
    assert signing.verify(webhook.secret, got.headers, got.body, now=now.timestamp())
    assert standardwebhooks.Webhook(webhook.secret).verify(got.body, got.headers) == done.payload
    # A changed body, another secret or a replay long after fails.
    tampered = got.body.replace(b"webhook.ping", b"webhook.pong")
    assert not signing.verify(webhook.secret, got.headers, tampered, now=now.timestamp())
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(webhook.secret).verify(tampered, got.headers)
    other = Webhook.objects.create(team=webhook.team, url=webhook.url)
    assert not signing.verify(other.secret, got.headers, got.body, now=now.timestamp())
    assert not signing.verify(webhook.secret, got.headers, got.body,
                              now=now.timestamp() + 3600)


def test_a_receiver_that_fails_twice_gets_it_on_the_third_try_after_backoff(
        webhook, receiver, settings):
    settings.WEBHOOK_RETRY_BASE_S = 30.0
    receiver.codes = [500, 503, 200]
    now = timezone.now()
    sent = delivery.ping(webhook, now)

    first = delivery.deliver(sent.pk, now)
    assert first.status == Delivery.Status.PENDING and first.attempts == 1
    assert first.response_code == 500 and first.last_error.startswith("HTTP 500")
    wait = (first.next_attempt_at - now).total_seconds()
    assert 24 <= wait <= 36  # 30 s, with jitter
    # Not due yet: nothing is sent.
    assert delivery.deliver(sent.pk, now + timedelta(seconds=wait - 1)) is None
    assert len(receiver.received) == 1

    second_at = first.next_attempt_at
    second = delivery.deliver(sent.pk, second_at)
    assert second.attempts == 2 and second.response_code == 503
    assert 96 <= (second.next_attempt_at - second_at).total_seconds() <= 144  # 4 × 30 s

    third = delivery.deliver(sent.pk, second.next_attempt_at)
    assert third.status == Delivery.Status.SUCCEEDED and third.attempts == 3
    assert third.delivered_at == second.next_attempt_at and third.next_attempt_at is None
    assert [h["code"] for h in third.history] == [500, 503, 200]
    waits = [wait, (second.next_attempt_at - second_at).total_seconds()]
    assert [h["retry_in_s"] for h in third.history[:2]] == pytest.approx(waits, abs=0.01)
    # The same message every time: one id, one body, each try signed anew.
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
    assert len({r.body for r in receiver.received}) == 1
    assert len({r.headers["webhook-timestamp"] for r in receiver.received}) == 3


def test_it_gives_up_after_the_last_try(webhook, receiver, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 3
    receiver.codes = [500]
    now = timezone.now()
    sent = delivery.ping(webhook, now)
    for _ in range(3):
        row = delivery.deliver(sent.pk, now)
        now = row.next_attempt_at or now
    assert row.status == Delivery.Status.FAILED and row.attempts == 3
    assert row.next_attempt_at is None
    assert delivery.due_ids(now + timedelta(days=2)) == []
    assert len(receiver.received) == 3


def test_the_waits_grow_fourfold_to_a_cap_of_twelve_hours_over_about_a_day(settings):
    settings.WEBHOOK_RETRY_BASE_S = 30.0
    middle = random.Random()
    middle.uniform = lambda a, b: (a + b) / 2  # the jitter's mean
    waits = [delivery.backoff_s(n, middle) for n in range(1, 8)]
    assert waits == [30, 120, 480, 1920, 7680, 30720, 43200]
    assert 20 * 3600 < sum(waits) < 26 * 3600  # 8 tries span about a day
    jittered = {delivery.backoff_s(1, random.Random(seed)) for seed in range(20)}
    assert len(jittered) == 20 and all(24 <= w < 36 for w in jittered)


def test_a_slow_receiver_is_a_failed_try_after_the_timeout(webhook, make_receiver, settings):
    settings.WEBHOOK_TIMEOUT_S = 0.5
    slow = make_receiver(delay_s=2.0)
    Webhook.objects.filter(pk=webhook.pk).update(url=slow.url)
    now = timezone.now()
    row = delivery.deliver(delivery.ping(webhook, now).pk, now)
    assert row.status == Delivery.Status.PENDING and row.attempts == 1
    assert row.response_code is None and "Timeout" in row.last_error
    assert row.history[0]["ms"] < 1900


def test_a_redirect_is_not_followed(webhook, make_receiver, receiver):
    elsewhere = make_receiver()
    receiver.codes, receiver.location = [302], elsewhere.url
    now = timezone.now()
    row = delivery.deliver(delivery.ping(webhook, now).pk, now)
    assert row.response_code == 302 and row.status == Delivery.Status.PENDING
    assert elsewhere.received == []


def test_a_private_address_is_refused_unless_its_network_is_allowed(webhook, receiver,
                                                                     settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    now = timezone.now()
    row = delivery.deliver(delivery.ping(webhook, now).pk, now)
    assert row.status == Delivery.Status.FAILED and row.attempts == 1
    assert "127.0.0.1" in row.last_error and "REGATTA_WEBHOOK_ALLOWED_NETWORKS" in row.last_error
    assert receiver.received == []


def test_a_receiver_that_answers_410_gone_deactivates_its_webhook(webhook, receiver):
    receiver.codes = [410]
    now = timezone.now()
    row = delivery.deliver(delivery.ping(webhook, now).pk, now)
    assert row.status == Delivery.Status.FAILED
    webhook.refresh_from_db()
    assert webhook.active is False


def test_a_delivery_is_claimed_by_one_worker_at_a_time(webhook, receiver):
    now = timezone.now()
    sent = delivery.ping(webhook, now)
    assert delivery._claim(sent.pk, now) is not None
    # A second worker handed the same id (the on-commit send and the sweep)
    # finds it leased and sends nothing.
    assert delivery.deliver(sent.pk, now) is None
    assert receiver.received == []
    # Once the lease runs out (its worker died mid-send), the sweep finds it.
    after = now + timedelta(seconds=delivery.lease_s() + 1)
    assert delivery.due_ids(after) == [sent.pk]
    assert delivery.deliver(sent.pk, after).status == Delivery.Status.SUCCEEDED


def test_retry_now_gives_a_given_up_delivery_one_more_try(webhook, receiver, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 1
    receiver.codes = [500, 200]
    now = timezone.now()
    sent = delivery.ping(webhook, now)
    assert delivery.deliver(sent.pk, now).status == Delivery.Status.FAILED
    later = now + timedelta(minutes=5)
    assert delivery.retry_now(sent, later) is True
    done = delivery.deliver(sent.pk, later)
    assert done.status == Delivery.Status.SUCCEEDED and done.attempts == 2
    assert delivery.retry_now(done, later) is False  # delivered: nothing to retry


def test_a_slack_webhook_is_sent_text(team, receiver, loopback_allowed):
    hook = Webhook.objects.create(team=team, url=receiver.url, format=Webhook.Format.SLACK,
                                  events=[EventType.JOB_FAILED])
    now = timezone.now()
    delivery.deliver(delivery.ping(hook, now).pk, now)
    [got] = receiver.received
    assert json.loads(got.body) == {"text": "[vision] Regatta test ping: this webhook works."}
    assert signing.verify(hook.secret, got.headers, got.body, now=now.timestamp())


def test_after_a_rotation_both_secrets_sign_for_a_day_then_only_the_new_one(webhook, receiver):
    old = webhook.secret
    now = timezone.now()
    new = webhook.rotate_secret(now)
    assert new != old and new.startswith("whsec_")
    delivery.deliver(delivery.ping(webhook, now).pk, now)
    day_later = now + timedelta(hours=24, seconds=1)
    delivery.deliver(delivery.ping(webhook, day_later).pk, day_later)
    during, after = receiver.received
    assert len(during.headers["webhook-signature"].split()) == 2
    for secret in (old, new):  # a receiver holding either secret accepts it
        assert signing.verify(secret, during.headers, during.body, now=now.timestamp())
        assert standardwebhooks.Webhook(secret).verify(during.body, during.headers)
    assert signing.verify(new, after.headers, after.body, now=day_later.timestamp())
    assert not signing.verify(old, after.headers, after.body, now=day_later.timestamp())
