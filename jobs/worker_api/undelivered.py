"""Collecting what a rank could not deliver before it exited.

A rank whose reports the web did not take in time (it was restarting, or
away longer than the rank's bounded wait at exit) leaves them in the job's
storage, one JSON-lines file per reporter at
`reports/attempt-<A>/rank-<R>-<id>.jsonl` (worker_image/regatta/spool.py,
docs/trainer-protocol.md). Once the attempt has ended the reconciler stores
them here, through the same checks and writers as the worker endpoints
(jobs/worker_api/reports.py), then deletes the file.

Exactly once: every item can be stored again without harm (an event by its
key, a metric point by (attempt, rank, name, step), a checkpoint report by
(job, step), a trace by (attempt, request, rank)), so an item the web took
late as well, or a file collected twice by a pass that died before deleting
it, stores nothing twice.
"""

from __future__ import annotations

import collections
import json
import logging
import re
from dataclasses import dataclass, field

from regatta import contract
from regatta.spool import FORMAT

from jobs.metrics import ingest
from jobs.models import JobAttempt
from jobs.profiling import record_trace
from jobs.worker_api import reports as worker_reports
from jobs.worker_api.fields import body_fields

log = logging.getLogger(__name__)
ATTEMPT_FOLDER = re.compile(r"^reports/attempt-(\d+)/")


@dataclass
class Collected:
    files: int = 0
    stored: collections.Counter = field(default_factory=collections.Counter)
    refused: collections.Counter = field(default_factory=collections.Counter)


def folder(attempt: JobAttempt) -> str:
    return f"reports/attempt-{attempt.pk}/"


def collect(attempt: JobAttempt, storage, now=None) -> Collected:
    """Store every undelivered report the attempt's ranks left, once."""
    done = Collected()
    for key in storage.list_keys(folder(attempt)):
        if not key.endswith(".jsonl"):
            continue
        header, items = _parse(storage.read_bytes(key))
        if header is None or str(header.get("attempt_id")) != str(attempt.pk):
            done.refused["files"] += 1
            log.warning("%s is not attempt %s's reports; left in place", key, attempt.pk)
            continue
        counts = collections.Counter()
        for endpoint, body in items:
            counts[_store(attempt, endpoint, body)] += 1
        attempt.job.record(
            "UndeliveredReportsCollected",
            f"{len(items)} reports rank {header.get('rank')} could not deliver before it "
            f"exited, collected from {key}", attempt=attempt, now=now,
            evidence={"file": key, "rank": header.get("rank"), "items": len(items),
                      **{k: v for k, v in counts.items()}},
            # A pass that dies before the delete collects the file again: one event.
            key=_event_key(attempt, key))
        storage.delete(key)
        done.files += 1
        done.stored.update({k: v for k, v in counts.items() if k != "refused"})
        done.refused["items"] += counts["refused"]
    return done


def collect_ended(job, storage, now=None) -> None:
    """What ranks of the job's ended attempts left after their attempt's end
    was judged (a rank stopped after another failed hands off as it exits)."""
    ids = {int(m.group(1)) for key in storage.list_keys("reports/")
           if (m := ATTEMPT_FOLDER.match(key))}
    if ids:
        for attempt in JobAttempt.objects.filter(job=job, pk__in=ids, ended_at__isnull=False):
            collect(attempt, storage, now)


def _event_key(attempt: JobAttempt, key: str) -> str:
    name = key.rsplit("/", 1)[-1].removesuffix(".jsonl")
    return f"collected-a{attempt.pk}-{name}"[:100]


def _parse(data: bytes) -> tuple[dict | None, list[tuple[str, dict]]]:
    lines = data.splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        return None, []
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None, []
    items = []
    for line in lines[1:]:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a torn last line: what it held is lost, the rest is not
        if isinstance(item, dict) and isinstance(item.get("body"), dict):
            items.append((str(item.get("endpoint")), item["body"]))
    return header, items


def _store(attempt: JobAttempt, endpoint: str, body: dict) -> str:
    """One item through its endpoint's checks and writer; what became of it."""
    if endpoint == contract.METRIC_BATCH.endpoint:
        return _store_metrics(attempt, body)
    known = {body.endpoint: body for body in (contract.EVENT, contract.CHECKPOINT,
                                              contract.PROFILE)}.get(endpoint)
    if known is None:
        return "refused"
    f = body_fields(body, known, attempt.job_id, attempt.pk)
    if endpoint == "events":
        values = worker_reports.event_values(f)
        if f.errors:
            return "refused"
        return "events" if worker_reports.record_event(attempt, values)[1] else "duplicates"
    if endpoint == "checkpoints":
        values = worker_reports.checkpoint_values(f, attempt.job)
        if f.errors:
            return "refused"
        worker_reports.record_checkpoint(attempt, values)
        return "checkpoints"
    report = worker_reports.profile_report(f, attempt)
    if report is None:
        return "refused"
    record_trace(attempt, report)
    return "profiles"


def _store_metrics(attempt: JobAttempt, body: dict) -> str:
    points = body.get("points")
    if not isinstance(points, list) or not all(map(ingest.point_ok, points)):
        return "refused"
    ingest.store(attempt.job_id, attempt.pk, ingest.rows(points), received=len(points))
    return "metric_batches"
