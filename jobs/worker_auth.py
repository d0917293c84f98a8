"""Per-attempt worker tokens: `Authorization: Bearer rgw_<attempt_id>_<secret>`.

Only the worker endpoints of that one attempt accept such a token; people's
endpoints ignore it (and so answer 401). The attempt id inside the token only
picks the row to compare against; the secret is checked by its sha256 in
constant time.
"""

import hashlib
import hmac

from rest_framework import authentication, exceptions, permissions

from .models import JobAttempt

WORKER_PREFIX = "rgw_"


class WorkerIdentity:
    """What `request.user` is for a worker: no person, no team."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False
    is_worker = True

    def __init__(self, attempt: JobAttempt):
        self.attempt = attempt
        self.pk = None

    def get_username(self) -> str:
        return f"worker:{self.attempt.pk}"

    def __str__(self):
        return self.get_username()


def _parse(raw: str) -> int | None:
    if not raw.startswith(WORKER_PREFIX):
        return None
    attempt_id, sep, secret = raw[len(WORKER_PREFIX):].partition("_")
    if not sep or not secret or not attempt_id.isdigit():
        return None
    return int(attempt_id)


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        parts = header.split()
        if len(parts) != 2 or parts[0] != self.keyword or not parts[1].startswith(WORKER_PREFIX):
            return None
        raw = parts[1]
        attempt_id = _parse(raw)
        if attempt_id is None:
            raise exceptions.AuthenticationFailed("Malformed worker token.")
        attempt = JobAttempt.objects.select_related("job").filter(pk=attempt_id).first()
        digest = hashlib.sha256(raw.encode()).hexdigest()
        if attempt is None or not attempt.token_hash or not hmac.compare_digest(
            digest, attempt.token_hash
        ):
            raise exceptions.AuthenticationFailed("Invalid worker token.")
        return WorkerIdentity(attempt), attempt

    def authenticate_header(self, request):
        return self.keyword


class IsAttemptWorker(permissions.BasePermission):
    """The token's attempt must be the attempt in the URL. A person's token
    or session is authenticated but not allowed (403)."""

    message = "Only this attempt's worker token is accepted here."

    def has_permission(self, request, view):
        attempt = request.auth
        if not isinstance(attempt, JobAttempt):
            return False
        return attempt.pk == view.kwargs.get("attempt_id")
