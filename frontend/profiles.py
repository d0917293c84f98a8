"""The job page's Profiles section: the newest on-demand profiles
(jobs/profiling/), each with a download link per rank."""

from __future__ import annotations

from itertools import groupby

from django.urls import reverse

from jobs.profiling import MAX_PROFILE_STEPS, traces_of
from jobs.profiling import requests as profile_requests

# The page shows the newest few; the API lists them all.
PROFILES_SHOWN = 5
TRACES_SHOWN = 5 * 64


def recent_profiles(job) -> list[dict]:
    traces = list(traces_of(job).select_related("attempt")[:TRACES_SHOWN])
    profiles = []
    for (_attempt, request_id), group in groupby(
            sorted(traces, key=lambda t: (t.attempt_id, t.request_id, t.rank)),
            key=lambda t: (t.attempt_id, t.request_id)):
        ranks = list(group)
        first = ranks[0]
        profiles.append({
            "request_id": request_id, "attempt": first.attempt.number,
            "start_step": first.start_step, "end_step": first.end_step,
            "created_at": max(t.created_at for t in ranks),
            "traces": [{"rank": t.rank, "bytes": t.bytes,
                        "url": reverse("jobs:job-profile-trace", args=[job.pk, t.pk])}
                       for t in ranks],
        })
    profiles.sort(key=lambda p: p["created_at"], reverse=True)
    return profiles[:PROFILES_SHOWN]


def context(job) -> dict:
    attempt = job.running_attempt() if job.phase == "running" else None
    return {"profiles": recent_profiles(job), "max_profile_steps": MAX_PROFILE_STEPS,
            "profile_pending": bool(attempt and profile_requests.pending(attempt))}
