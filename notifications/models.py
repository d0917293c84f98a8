"""A team's webhooks and the log of what was sent to each.

A Delivery is written in the same transaction as the timeline event it
reports (an outbox): a transition that rolls back notifies nobody, and one
that commits is delivered at least once, by the on-commit send or, failing
that, by the beat sweep (notifications/delivery.py).
"""

import base64
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from jobs.models import JobEvent, Team

from . import targets
from .events import SUBSCRIBABLE, EventType

SECRET_PREFIX = "whsec_"
ROTATION_OVERLAP = timedelta(hours=24)


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


class Webhook(models.Model):
    class Format(models.TextChoices):
        JSON = "json", "JSON (the event and its data)"
        SLACK = "slack", "Slack-compatible text ({\"text\": …})"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhooks")
    # http(s) only, checked by notifications/targets.py (a URLField would
    # take ftp:// too).
    url = models.CharField(max_length=2000)
    description = models.CharField(max_length=200, blank=True)
    # The event types (notifications/events.py) this webhook is sent.
    events = models.JSONField(default=list)
    format = models.CharField(max_length=8, choices=Format.choices, default=Format.JSON)
    active = models.BooleanField(default=True)
    # Kept as is, not hashed: every delivery is signed with it. Shown to
    # people once, when the webhook is created.
    secret = models.CharField(max_length=100, default=new_secret, editable=False)
    # After a rotation, the old secret signs too until `previous_secret_until`,
    # so receivers can switch without dropping a delivery.
    previous_secret = models.CharField(max_length=100, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team__name", "id"]
        indexes = [models.Index(fields=["team", "active"])]

    def __str__(self):
        return f"{self.team}: {self.url}"

    @property
    def secret_hint(self) -> str:
        """Enough of the secret to tell two apart, never enough to sign."""
        return self.secret[:len(SECRET_PREFIX) + 4] + "…"

    def clean(self):
        # The admin's form (the API validates the same in validators.py).
        errors = {}
        try:
            targets.check_syntax(self.url)
        except targets.UnsafeTarget as exc:
            errors["url"] = str(exc)
        events = self.events if isinstance(self.events, list) else [None]
        if not all(isinstance(e, str) and e in SUBSCRIBABLE for e in events):
            errors["events"] = f"A list of: {', '.join(SUBSCRIBABLE)}."
        if errors:
            raise ValidationError(errors)

    def rotate_secret(self, now) -> str:
        """A new secret, shown once; the old one keeps signing for
        ROTATION_OVERLAP beside it (Standard Webhooks sends both)."""
        fresh = new_secret()
        Webhook.objects.filter(pk=self.pk).update(
            secret=fresh, previous_secret=self.secret,
            previous_secret_until=now + ROTATION_OVERLAP)
        self.refresh_from_db()
        return fresh

    def signing_secrets(self, now) -> list[str]:
        if self.previous_secret and self.previous_secret_until and \
                now < self.previous_secret_until:
            return [self.secret, self.previous_secret]
        return [self.secret]

    def wants(self, event_type: str) -> bool:
        return self.active and event_type in (self.events or [])


class Delivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending (sending or waiting to retry)"
        SUCCEEDED = "succeeded", "Delivered (2xx)"
        FAILED = "failed", "Given up"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=32, choices=EventType.choices)
    # The timeline event it reports; none for a ping.
    job_event = models.ForeignKey(JobEvent, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+")
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When the next try is due; while a worker sends, a short lease past now
    # (a worker that dies mid-send leaves it to the sweep once that passes).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # One entry per try: when, the status code or the error, how long it took,
    # and the wait chosen before the next.
    history = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["status", "next_attempt_at"]),
            models.Index(fields=["webhook", "-created_at"]),
        ]

    def __str__(self):
        return f"{self.event_type} → {self.webhook_id} ({self.status})"

    @property
    def message_id(self) -> str:
        """The `webhook-id` header: the same on every retry, so a receiver
        can drop a delivery it has already handled."""
        return f"msg_{self.pk}"
