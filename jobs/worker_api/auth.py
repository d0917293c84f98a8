"""Per-attempt worker tokens: `Authorization: Bearer rgw_<attempt>_<job>_<number>_<mac>`.

Only the worker endpoints of that one attempt accept such a token; people's
endpoints ignore it (and so answer 401). The token is an HMAC of the ids it
carries (jobs/worker_api/tokens.py), so it is verified with no database read:
the metrics and heartbeat endpoints, hit by every rank every few seconds,
spend their queries on the writes they exist for.

Nothing about the attempt is cached to decide whether it may still report:
- metrics of an ended attempt are accepted (late metrics flushed after the
  attempt ended are part of its record, tests/jobs/worker_api/test_worker_api.py
  ::test_an_ended_attempt_may_still_report_late_metrics);
- a heartbeat writes the attempt's row anyway, conditionally on it not
  having ended, and learns from that same write whether it has
  (jobs/worker_api/heartbeats.py), so an ended attempt is told to stop on
  its very next beat;
- an attempt whose row is gone (its job deleted) fails the foreign keys of
  whatever it writes, and is answered 401 (jobs/metrics/ingest.py).

Tokens issued in the earlier `rgw_<attempt>_<mac>` format (held by ranks
launched before the upgrade) are still accepted, checked against the
attempt's stored sha256 as before: one read, and only for them.
"""

import hashlib
import hmac

from rest_framework import authentication, exceptions, permissions

from jobs.models import JobAttempt
from jobs.worker_api import tokens as worker_tokens
from jobs.worker_api.tokens import Claim

WORKER_PREFIX = worker_tokens.PREFIX


class WorkerIdentity:
    """What `request.user` is for a worker: no person, no team."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_anonymous = False
    is_worker = True

    def __init__(self, claim: Claim):
        self.claim = claim
        self.pk = None

    def get_username(self) -> str:
        return f"worker:{self.claim.attempt_id}"

    def __str__(self):
        return self.get_username()


def _legacy_claim(raw: str) -> Claim | None:
    attempt_id = worker_tokens.attempt_id_of(raw)
    if attempt_id is None:
        raise exceptions.AuthenticationFailed("Malformed worker token.")
    row = JobAttempt.objects.filter(pk=attempt_id).values_list(
        "job_id", "number", "token_hash").first()
    digest = hashlib.sha256(raw.encode()).hexdigest()
    if row is None or not row[2] or not hmac.compare_digest(digest, row[2]):
        return None
    return Claim(attempt_id, row[0], row[1])


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        parts = header.split()
        if len(parts) != 2 or parts[0] != self.keyword or not parts[1].startswith(WORKER_PREFIX):
            return None
        claim = worker_tokens.verify(parts[1]) or _legacy_claim(parts[1])
        if claim is None:
            raise exceptions.AuthenticationFailed("Invalid worker token.")
        return WorkerIdentity(claim), claim

    def authenticate_header(self, request):
        return self.keyword


class IsAttemptWorker(permissions.BasePermission):
    """The token's attempt must be the attempt in the URL. A person's token
    or session is authenticated but not allowed (403)."""

    message = "Only this attempt's worker token is accepted here."

    def has_permission(self, request, view):
        claim = request.auth
        if not isinstance(claim, Claim):
            return False
        return claim.attempt_id == view.kwargs.get("attempt_id")
