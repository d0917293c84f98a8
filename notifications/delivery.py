"""Sending deliveries: at least once, signed, retried with backoff.

A delivery is created with the event that causes it (same transaction) and
sent by a task enqueued on commit; the beat sweep sends every delivery whose
try is due, so a lost task, a broker that was down or a worker restart costs
a sweep interval, never a notification. Each try first claims the row with a
conditional update that pushes `next_attempt_at` a lease ahead: two workers
handed the same delivery send it once, and a worker that dies mid-send
leaves it to the sweep once the lease runs out (which may send it twice: a
receiver drops repeats by their `webhook-id`).

Reconcilers never wait on any of this: they write rows; HTTP happens in the
delivery task only.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.db import transaction

from controlplane.lib.tasks import Port
from jobs.models import JobEvent

from . import payloads, pinning, signing, targets
from .events import types_for
from .models import Delivery, Webhook

log = logging.getLogger(__name__)

# The delivery task, provided by NotificationsConfig.ready (tasks.py imports
# this module).
DELIVER = Port("deliver a webhook")
# Each later wait is this many times the one before, up to MAX_WAIT_S.
BACKOFF_FACTOR = 4
MAX_WAIT_S = 12 * 3600
# What is kept of a receiver's reply, and of an error, in the log.
EXCERPT = 300
USER_AGENT = "Regatta-Webhooks/1"


# --- creating deliveries ----------------------------------------------------

def notify(event: JobEvent) -> list[Delivery]:
    """One delivery per active webhook of the job's team subscribed to what
    `event` stands for. Called inside the transaction that writes the event;
    a fault here is logged and costs the notification, never the event."""
    types = types_for(event)
    if not types:
        return []
    try:
        with transaction.atomic():  # a savepoint: the caller's transaction survives
            return _create_for_event(event, types)
    except Exception:
        log.exception("webhooks for job event %s not written", event.pk)
        return []


def _create_for_event(event: JobEvent, types: list[str]) -> list[Delivery]:
    hooks = list(Webhook.objects.filter(team_id=event.job.team_id, active=True))
    created = []
    for event_type in types:
        wanted = [hook for hook in hooks if hook.wants(event_type)]
        if wanted:
            document = payloads.event_document(event_type, event)
            created += [_create(hook, event_type, document, event.created_at, job_event=event)
                        for hook in wanted]
    return created


def ping(webhook: Webhook, now: datetime) -> Delivery:
    """A test delivery, whatever the webhook subscribes to."""
    document = payloads.ping_document(webhook, now)
    return _create(webhook, document["type"], document, now)


def _create(webhook: Webhook, event_type: str, document: dict, now: datetime,
            job_event: JobEvent | None = None) -> Delivery:
    delivery = Delivery.objects.create(
        webhook=webhook, event_type=event_type, job_event=job_event,
        payload=payloads.render(webhook, document), created_at=now, next_attempt_at=now,
    )
    DELIVER.soon(delivery.pk)
    return delivery


def retry_now(delivery: Delivery, now: datetime) -> bool:
    """Try again now, even one given up on (it gets one more try then).
    False if it was delivered already."""
    changed = Delivery.objects.filter(pk=delivery.pk).exclude(
        status=Delivery.Status.SUCCEEDED).update(status=Delivery.Status.PENDING,
                                                 next_attempt_at=now)
    if changed:
        DELIVER.soon(delivery.pk)
    return bool(changed)


# --- sending ----------------------------------------------------------------

@dataclass
class Outcome:
    code: int | None = None
    error: str = ""
    ms: int = 0
    # No later try can do better: the target is refused, or the webhook gone.
    permanent: bool = False

    @property
    def ok(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


def due_ids(now: datetime, limit: int = 500) -> list[int]:
    """Deliveries whose try is due, oldest first (the sweep's bounded batch)."""
    return list(Delivery.objects.filter(status=Delivery.Status.PENDING,
                                        next_attempt_at__lte=now)
                .order_by("next_attempt_at", "id").values_list("pk", flat=True)[:limit])


def lease_s() -> float:
    # Longer than one try can take (connect plus read timeouts).
    return 2 * settings.WEBHOOK_TIMEOUT_S + 30


def deliver(delivery_id: int, now: datetime, rng: random.Random | None = None) -> Delivery | None:
    """One try of a due delivery; None if it is not due or another worker
    holds it. Returns the delivery as recorded after the try."""
    delivery = _claim(delivery_id, now)
    if delivery is None:
        return None
    outcome = _send(delivery, now)
    _record(delivery, outcome, now, rng or random)
    delivery.refresh_from_db()
    return delivery


def _claim(delivery_id: int, now: datetime) -> Delivery | None:
    row = (Delivery.objects.select_related("webhook")
           .filter(pk=delivery_id, status=Delivery.Status.PENDING, next_attempt_at__lte=now)
           .first())
    if row is None:
        return None
    changed = Delivery.objects.filter(
        pk=row.pk, status=Delivery.Status.PENDING, attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
    ).update(next_attempt_at=now + timedelta(seconds=lease_s()))
    return row if changed else None


def _send(delivery: Delivery, now: datetime) -> Outcome:
    webhook = delivery.webhook
    if not webhook.active:
        return Outcome(error="the webhook was deactivated", permanent=True)
    try:
        target = targets.resolve(webhook.url)
    except targets.UnsafeTarget as exc:
        return Outcome(error=str(exc), permanent=True)
    except OSError as exc:
        return Outcome(error=f"cannot resolve the host: {exc}"[:EXCERPT])
    return _post(webhook, delivery, now, target)


def _post(webhook: Webhook, delivery: Delivery, now: datetime,
          target: targets.Target) -> Outcome:
    body = payloads.body(delivery.payload)
    headers = {
        "Content-Type": "application/json", "User-Agent": USER_AGENT,
        "X-Regatta-Event": delivery.event_type,
        **signing.headers(webhook.signing_secrets(now), delivery.message_id,
                          int(now.timestamp()), body),
    }
    timeout = settings.WEBHOOK_TIMEOUT_S
    started = time.monotonic()
    try:
        # To the address just checked, never a fresh DNS answer; redirects
        # are not followed: one could lead to a refused address.
        with pinning.session(target.addresses[0]) as http, http.post(
                webhook.url, data=body, headers=headers, timeout=(timeout, timeout),
                allow_redirects=False, stream=True) as resp:
            reply = resp.raw.read(EXCERPT, decode_content=True) or b""
            code = resp.status_code
    except requests.RequestException as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:EXCERPT], ms=_ms(started))
    error = "" if 200 <= code < 300 else f"HTTP {code}: {reply.decode(errors='replace')}"
    # 410 Gone: the receiver says this webhook is no more (Standard Webhooks).
    return Outcome(code=code, error=error[:EXCERPT], ms=_ms(started), permanent=code == 410)


def _ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def backoff_s(tries: int, rng) -> float:
    """The wait after the `tries`-th failed try: 30 s, 2 min, 8 min, … (with
    the default base), capped at 12 h, times a jitter in [0.8, 1.2) so the
    retries of many deliveries failed at once do not arrive together."""
    wait = min(MAX_WAIT_S, settings.WEBHOOK_RETRY_BASE_S * BACKOFF_FACTOR ** (tries - 1))
    return wait * rng.uniform(0.8, 1.2)


def _record(delivery: Delivery, outcome: Outcome, now: datetime, rng) -> None:
    tries = delivery.attempts + 1
    entry = {"at": now.isoformat(), "code": outcome.code, "error": outcome.error,
             "ms": outcome.ms}
    fields = {"attempts": tries, "last_attempt_at": now, "response_code": outcome.code,
              "last_error": outcome.error, "next_attempt_at": None}
    if outcome.ok:
        fields.update(status=Delivery.Status.SUCCEEDED, delivered_at=now)
    elif outcome.permanent or tries >= settings.WEBHOOK_MAX_ATTEMPTS:
        fields.update(status=Delivery.Status.FAILED)
    else:
        wait = backoff_s(tries, rng)
        entry["retry_in_s"] = round(wait, 3)
        fields.update(next_attempt_at=now + timedelta(seconds=wait))
    if outcome.code == 410:
        Webhook.objects.filter(pk=delivery.webhook_id).update(active=False)
    # Conditional on the try it claimed: a stale worker whose lease ran out
    # and whose row moved on writes nothing.
    Delivery.objects.filter(pk=delivery.pk, attempts=delivery.attempts).update(
        history=[*(delivery.history or []), entry], **fields)
