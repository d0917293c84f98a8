import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX = "rgt_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A person's API token. Only its sha256 is stored; the raw value is
    shown once, when it is created."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters, so a person can tell tokens apart in a list.
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user, name: str) -> tuple["ApiToken", str]:
        raw = PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, prefix=raw[:12], token_hash=hash_token(raw)
        )
        return token, raw

    def revoke(self, now=None) -> bool:
        changed = ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
            revoked_at=now or timezone.now()
        )
        self.refresh_from_db()
        return bool(changed)
