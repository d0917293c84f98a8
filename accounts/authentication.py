from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import PREFIX, ApiToken, hash_token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer rgt_…` for people. Worker tokens (`rgw_…`) are
    not accepted here; only the worker endpoints take them."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0] not in ("Bearer", "Token"):
            return None
        raw = parts[1]
        if not raw.startswith(PREFIX):
            return None
        token = (
            ApiToken.objects.active().select_related("user").filter(token_hash=hash_token(raw)).first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
