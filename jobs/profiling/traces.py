"""Profiling on demand, as the control plane sees it.

A person asks for "the next N steps" (jobs/profiling/requests.py, the
`profile` directive on heartbeat replies); every rank profiles the same
steps and writes a gzipped Chrome trace into the job's storage at
`regatta.storage.profile_key(...)` (worker_image/regatta/profiling.py), then
reports it here. A report is trusted only for its own attempt, a request
that attempt was asked, a rank of its gang and exactly the key the control
plane computes, so a download only ever opens a file inside the job's storage.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction
from regatta.storage import profile_key

from checkpoints.confinement import link_below_root, reported_key_uri_ok
from jobs.checkpointing import job_checkpoint_uri
from jobs.models import JobAttempt
from jobs.profiling.models import ProfileTrace

# The most steps one profile may cover: a trace holds every op of every
# step, and a big model's step makes tens of megabytes of it.
MAX_PROFILE_STEPS = 50


@dataclass(frozen=True)
class TraceReport:
    request_id: str
    rank: int
    start_step: int
    steps: int
    uri: str
    bytes: int


def report_errors(attempt: JobAttempt, report: TraceReport) -> dict[str, list[str]]:
    """What is wrong with a worker's trace report, by field (empty: none)."""
    errors: dict[str, list[str]] = {}
    known = report.request_id == attempt.profile_request_id or ProfileTrace.objects.filter(
        attempt=attempt, request_id=report.request_id).exists()
    if not known:
        errors["request_id"] = ["Not a profile this attempt was asked for."]
    if report.rank >= attempt.job.world_size:
        errors["rank"] = [f"Must be below the gang's {attempt.job.world_size} ranks."]
    key = profile_key(report.start_step, report.request_id, report.rank)
    storage_uri = job_checkpoint_uri(attempt.job)
    path = f"{storage_uri.rstrip('/')}/{key}"
    if not reported_key_uri_ok(storage_uri, key, report.uri):
        errors["uri"] = [f"Must be this job's trace file: {path}"]
    elif link := link_below_root(path):
        errors["uri"] = [f"{link} is a symbolic link: a trace is reported from its own real "
                         "file."]
    return errors


def record_trace(attempt: JobAttempt, report: TraceReport) -> tuple[ProfileTrace, bool]:
    """Store one rank's trace; idempotent per (attempt, request, rank). The
    first trace of a profile writes the timeline event."""
    fields = {"job_id": attempt.job_id, "start_step": report.start_step, "steps": report.steps,
              "path": profile_key(report.start_step, report.request_id, report.rank),
              "bytes": report.bytes}
    try:
        with transaction.atomic():
            trace, created = ProfileTrace.objects.get_or_create(
                attempt=attempt, request_id=report.request_id, rank=report.rank,
                defaults=fields)
            if created and not ProfileTrace.objects.filter(
                    attempt=attempt, request_id=report.request_id).exclude(pk=trace.pk).exists():
                end = report.start_step + report.steps - 1
                attempt.job.record(
                    "ProfileWritten", f"profile of steps {report.start_step}..{end}: traces "
                    f"under {job_checkpoint_uri(attempt.job).rstrip('/')}/"
                    f"{fields['path'].rsplit('/', 1)[0]}/",
                    actor=f"worker:rank{report.rank}", attempt=attempt,
                    evidence={"request_id": report.request_id, "start_step": report.start_step,
                              "steps": report.steps})
    except IntegrityError:  # the same report twice at once: the other one stored it
        return ProfileTrace.objects.get(attempt=attempt, request_id=report.request_id,
                                        rank=report.rank), False
    return trace, created


def traces_of(job):
    return ProfileTrace.objects.filter(job=job).order_by("-created_at", "request_id", "rank")
