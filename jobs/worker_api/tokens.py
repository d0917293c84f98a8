"""The per-attempt worker token, derived rather than stored.

`rgw_<attempt_id>_<job_id>_<number>_<mac>` where `mac` is an HMAC (keyed by
SECRET_KEY) of the attempt's id, job and number. Everything needed to check
it travels in the token itself, so the worker endpoints verify it with no
database read: a forger who changes any id needs SECRET_KEY to make a
matching mac. The database keeps only the token's sha256 (JobAttempt.
token_hash), which is what tokens issued before this format (`rgw_<attempt
_id>_<mac>`, still held by ranks launched earlier) are checked against.

No model imports here: jobs.models derives tokens with it and
jobs.worker_api.auth verifies them, and the arrows point one way.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from django.utils.crypto import salted_hmac

from jobs.models import JobAttempt, hash_token

PREFIX = "rgw_"
_SALT = "regatta.jobs.JobAttempt.worker_token"


@dataclass(frozen=True)
class Claim:
    """What a verified token says: the attempt, its job and its number."""

    attempt_id: int
    job_id: int
    number: int


def _mac(attempt_id: int, job_id: int, number: int) -> str:
    return salted_hmac(_SALT, f"{attempt_id}:{job_id}:{number}",
                       algorithm="sha256").hexdigest()


def make(attempt_id: int, job_id: int, number: int) -> str:
    """The same token for the same attempt on every call (a pass that
    re-runs a launch must hand the ranks the token they already hold)."""
    return f"{PREFIX}{attempt_id}_{job_id}_{number}_{_mac(attempt_id, job_id, number)}"


def attempt_id_of(raw: str) -> int | None:
    """The attempt a token of either format names, or None if malformed."""
    if not raw.startswith(PREFIX):
        return None
    attempt_id, sep, secret = raw[len(PREFIX):].partition("_")
    if not sep or not secret or not attempt_id.isdigit():
        return None
    return int(attempt_id)


def verify(raw: str) -> Claim | None:
    """The claim of a current-format token whose mac checks out; None for
    anything else (a legacy token is checked against the database instead)."""
    parts = raw[len(PREFIX):].split("_") if raw.startswith(PREFIX) else ()
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    attempt_id, job_id, number = (int(p) for p in parts[:3])
    if not hmac.compare_digest(parts[3], _mac(attempt_id, job_id, number)):
        return None
    return Claim(attempt_id, job_id, number)


def issue(attempt) -> str:
    """The attempt's worker token; only its hash is kept on the row.

    Derived from SECRET_KEY and the attempt rather than drawn at random,
    so every pass gets the same one: a pass that died after the provider
    started the ranks, and before the row said so, leaves the next pass
    adopting those ranks, and the token they hold must still be accepted
    (tests/e2e/test_worker_crash_e2e.py). It carries the ids its HMAC
    covers, so the worker endpoints check it without a read."""
    raw = make(attempt.pk, attempt.job_id, attempt.number)
    attempt.token_hash = hash_token(raw)
    JobAttempt.objects.filter(pk=attempt.pk).update(token_hash=attempt.token_hash)
    return raw
