"""A person's ask for a profile of the next N steps of a running gang: the
`profile` directive its ranks get on their heartbeat replies
(jobs/worker_api/heartbeats.py), pending until a rank sends its trace.
`profile_next` is what the API, the UI and the admin call."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from accounts.permissions import actor_for
from controlplane.lib.errors import IllegalTransition, Refused
from jobs.models import JobAttempt
from jobs.profiling.models import ProfileTrace


def pending(attempt: JobAttempt) -> bool:
    """A profile was asked for and no rank has sent its trace yet."""
    return bool(attempt.profile_request_id) and not ProfileTrace.objects.filter(
        attempt=attempt, request_id=attempt.profile_request_id).exists()


def request(attempt: JobAttempt, steps: int, actor: str, now=None) -> tuple[str, bool]:
    """Ask every rank of the running gang to profile its next `steps`
    steps: (request id, whether it is new). Idempotent while a request
    is pending: the pending one is returned and nothing is written.
    Raises IllegalTransition unless the attempt runs."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = JobAttempt.objects.select_for_update().filter(pk=attempt.pk).first()
        if locked is None or locked.state != JobAttempt.State.RUNNING:
            raise IllegalTransition("attempt", attempt.pk,
                                    locked.state if locked else attempt.state, "profile")
        if pending(locked):
            attempt.refresh_from_db()
            return locked.profile_request_id, False
        request_id = secrets.token_hex(8)
        JobAttempt.objects.filter(pk=attempt.pk).update(
            profile_request_id=request_id, profile_steps=steps, profile_requested_at=now)
        attempt.refresh_from_db()
        attempt.job.record("ProfileRequested", f"profile of the next {steps} steps asked by "
                           f"{actor}", actor=actor, attempt=attempt,
                           evidence={"request_id": request_id, "steps": steps}, now=now)
    return request_id, True


def profile_next(job, steps: int, user) -> tuple[JobAttempt, str, bool]:
    """Ask every rank to profile the next `steps` steps; returns the attempt,
    the request's id and whether this call made it (a pending one is kept)."""
    attempt = job.running_attempt()
    if attempt is None:
        raise Refused(f"Job {job.pk} ({job.name}) is {job.phase}: only a running job can be "
                      "profiled.")
    if job.heartbeats_missing:
        # It would stay pending for ever: directives ride on heartbeat replies.
        raise Refused(f"Job {job.pk} ({job.name}) runs a program that sends no heartbeats, so "
                      "it never gets the profile directive; report through the regatta SDK.")
    request_id, created = request(attempt, steps, actor_for(user))
    return attempt, request_id, created
