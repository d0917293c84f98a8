"""What the job page shows beside its charts: attempts, checkpoints, goodput,
the checkpoint interval and the preflight bandwidth.

The page re-renders these tables on every poll, so each is bounded: a job
that ran for weeks has thousands of checkpoints and may have hundreds of
attempts, and a poll must cost the same for it as for a new one. The full
lists live on their own paginated pages (views.jobs.job_checkpoints,
job_attempts), which are not polled.
"""

import hashlib

from django.db.models import Count, Max, Q, Subquery, Sum

from checkpoints.models import Checkpoint
from jobs import goodput as ledger
from jobs.goodput.models import GoodputEntry
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.profiling.models import ProfileTrace

EVENT_LIMIT = 200
# A page's revision changes at least this often, so what it shows relative
# to now ("3 min ago", a backoff's countdown) is never staler than this.
REVISION_PERIOD_S = 30
# Fields of the job row that heartbeats and reconcile passes move every few
# seconds while it runs: the status fragment shows them on every poll, and
# the tables' revision leaves them out, or it would change on every poll.
MOVED_BY_HEARTBEATS = frozenset({"current_step", "progress", "next_reconcile_at"})
CHECKPOINT_ROWS = 20
ATTEMPT_ROWS = 10
EVAL_ROWS = 20
GOODPUT_ORDER = [c.value for c in GoodputEntry.Category]
GOODPUT_LABELS = dict(GoodputEntry.Category.choices)
QUEUED = GoodputEntry.Category.QUEUED
PRODUCTIVE = GoodputEntry.Category.PRODUCTIVE
EVAL = GoodputEntry.Category.EVAL
LOADABLE = tuple(s.value for s in Checkpoint.LOADABLE)


def attempts(job: TrainingJob, limit: int | None = ATTEMPT_ROWS):
    """The newest attempts first; `limit=None` for a paginated page to slice."""
    rows = (job.attempts.prefetch_related("placements__node").select_related("resumed_from")
            .order_by("-number"))
    return rows if limit is None else rows[:limit]


def checkpoints(job: TrainingJob, limit: int = CHECKPOINT_ROWS):
    """The newest checkpoints retention has not deleted."""
    return job.checkpoints.exclude(state=Checkpoint.State.DELETED).order_by("-step")[:limit]


def all_checkpoints(job: TrainingJob):
    """Every checkpoint, deleted ones included: the history page's record."""
    return job.checkpoints.order_by("-step")


def checkpoint_counts(job: TrainingJob, shown: int) -> dict:
    kept = job.checkpoints.exclude(state=Checkpoint.State.DELETED).count()
    return {
        "shown": shown, "kept": kept, "older": max(0, kept - shown),
        "deleted": job.checkpoints.filter(state=Checkpoint.State.DELETED).count(),
    }


def preemptions(job: TrainingJob) -> list[dict]:
    """Each time the job was preempted or reclaimed (jobs/reconcile/preemption.py),
    newest first: by which job, the checkpoint it saved, what it lost."""
    rows = job.events.filter(kind="Preempted").order_by("-created_at", "-id")[:EVENT_LIMIT]
    return [{"at": e.created_at, "message": e.message, **(e.evidence or {})} for e in rows]


def evals(job: TrainingJob) -> list[dict]:
    """The job's newest eval runs (jobs/evals/), by checkpoint step, with
    what they reported."""
    rows = reversed(TrainingJob.objects.filter(parent=job)
                    .annotate(attempt_count=Count("attempts"))
                    .order_by("-eval_step")[:EVAL_ROWS])
    return [{"pk": r.pk, "eval_step": r.eval_step, "phase": r.phase,
             "pending_reason": r.pending_reason if r.phase == "queued" else "",
             "attempt_count": r.attempt_count,
             "metrics": (r.eval_result or {}).get("metrics") or {},
             "samples": (r.eval_result or {}).get("samples") or []} for r in rows]


def events(job: TrainingJob):
    """The newest events, shown newest first."""
    return job.events.select_related("attempt").order_by("-created_at", "-id")[:EVENT_LIMIT]


def ledger_view(entries) -> dict:
    """The goodput ledger's own summary (jobs.goodput.summarize) as the pages
    show it: one row per category, in the ledger's order, and the GPU-hours
    the job(s) held, of which productive and lost.

    Queueing holds no GPUs: its row shows the wait, never GPU-hours, and it
    counts neither as held nor as lost, as in the ledger's goodput ratio.
    Eval runs' GPU-hours (a team's page) are shown on their own row, apart
    from training's held, productive and lost time.
    """
    summary = ledger.summarize(entries)
    cats = summary["categories"]
    held_s = sum(v["gpu_seconds"] for k, v in cats.items() if k not in (QUEUED, EVAL))
    rows = []
    for cat in GOODPUT_ORDER:
        line = cats.get(cat) or {"seconds": 0.0, "gpu_seconds": 0.0}
        if not line["seconds"] and not line["gpu_seconds"]:
            continue
        holds = cat != QUEUED
        gpu_s = line["gpu_seconds"] if holds else 0.0
        rows.append({
            "category": cat, "label": GOODPUT_LABELS[cat], "seconds": line["seconds"],
            "holds_gpus": holds, "gpu_seconds": gpu_s, "gpu_hours": gpu_s / 3600.0,
            "share": (gpu_s / held_s) if (holds and held_s and cat != EVAL) else None,
        })
    productive_s = cats[PRODUCTIVE]["gpu_seconds"]
    ratio = summary["goodput_ratio"]
    return {
        "rows": rows,
        "chart": [r for r in rows if r["holds_gpus"] and r["category"] != EVAL],
        "held": held_s / 3600.0,
        "productive": productive_s / 3600.0,
        "lost": (held_s - productive_s) / 3600.0,
        "queued_seconds": cats[QUEUED]["seconds"],
        "goodput_pct": None if ratio is None else 100.0 * ratio,
    }


def job_goodput(job: TrainingJob) -> dict:
    return ledger_view(GoodputEntry.objects.filter(job=job))


def latest_preflight(job: TrainingJob, newest: JobAttempt | None = None) -> dict:
    """The newest attempt's preflight, with its all-reduce bandwidth in GB/s.

    Providers report it either whole (`allreduce_gbps`) or per node under
    `allreduce` (the local provider: each node's `busbw_gbps`); the gang runs
    at its slowest node's pace, so the minimum is what counts. A launch that
    skipped the check (its nodes had all passed recently) measured nothing:
    the newest check that ran is shown instead, when there is one. `newest`
    is the job's newest attempt, where the caller has read it already.
    """
    if newest is not None and newest.preflight and not newest.preflight.get("skipped"):
        attempt = newest  # the common case, and no query: the live poll has it
    else:
        reports = (job.attempts.exclude(preflight={}).order_by("-number")
                   .only("number", "preflight"))
        newest = reports.first()
        if newest is None:
            return {}
        attempt = next((a for a in reports[:50] if not a.preflight.get("skipped")), newest)
    report = dict(attempt.preflight)
    gbps = report.get("allreduce_gbps")
    if gbps is None and isinstance(report.get("allreduce"), dict):
        per_node = [r.get("busbw_gbps") for r in report["allreduce"].values()
                    if isinstance(r, dict)]
        per_node = [v for v in per_node if isinstance(v, int | float)]
        gbps = min(per_node) if per_node else None
    report["bandwidth_gbps"] = gbps
    report["attempt"] = attempt.number
    return report


def interval(job: TrainingJob) -> dict:
    """The checkpoint interval in force and, for "auto", what it came from."""
    return {
        "policy": job.checkpoint_policy,
        "steps": job.effective_checkpoint_every,
        "configured": job.checkpoint_every_steps,
        "inputs": job.checkpoint_interval_inputs if job.checkpoint_policy == "auto" else {},
    }



def _per_job(queryset, aggregate):
    """`aggregate` over the job's rows of `queryset`, as a scalar subquery
    (grouped by the job: one group)."""
    return Subquery(queryset.order_by().values("job").annotate(v=aggregate).values("v")[:1])


def revision(job: TrainingJob, now) -> tuple[str, JobAttempt | None]:
    """A fingerprint of everything the job page's tables show, read in one
    query of stamps beside the job's row and its newest attempt (returned
    too: the status reads it). The page sends the fingerprint back on its
    next poll, and tables that have not changed are not rendered again
    (views.jobs.job_live).

    It covers the job row (phase, conditions, every field but those a
    heartbeat or a reconcile pass moves: the status fragment, rendered on
    every poll, shows those), the timeline of the job and of its eval runs
    (every transition of a job or an attempt writes an event), the newest
    attempt's row (preflight, a pending profile), the checkpoints' states
    (verification, corruption and retention change rows in place), the
    goodput ledger (entries grow in place while an attempt runs), the
    profiles, and the time in periods of REVISION_PERIOD_S, so text relative
    to now ("3 min ago") is never staler than that.
    """
    checkpoints = Checkpoint.objects.filter(job=job)
    goodput = GoodputEntry.objects.filter(job=job)
    stamps = TrainingJob.objects.filter(pk=job.pk).annotate(
        rev_last_event=Subquery(JobEvent.objects.filter(Q(job=job) | Q(job__parent=job))
                            .order_by("-id").values("id")[:1]),
        rev_checkpoints=_per_job(checkpoints, Count("id")),
        rev_verified=_per_job(checkpoints, Count("verified_at")),
        rev_deleted=_per_job(checkpoints.filter(state=Checkpoint.State.DELETED), Count("id")),
        rev_corrupt=_per_job(checkpoints.filter(state=Checkpoint.State.CORRUPT), Count("id")),
        rev_goodput_rows=_per_job(goodput, Count("id")),
        rev_goodput_s=_per_job(goodput, Sum("seconds")),
        rev_profiles=_per_job(ProfileTrace.objects.filter(job=job), Max("id")),
    ).values_list("rev_last_event", "rev_checkpoints", "rev_verified", "rev_deleted",
                  "rev_corrupt", "rev_goodput_rows", "rev_goodput_s", "rev_profiles").first()
    newest = job.attempts.order_by("-number").first()
    parts = [
        [getattr(job, f.attname) for f in TrainingJob._meta.concrete_fields
         if f.name not in MOVED_BY_HEARTBEATS],
        stamps,
        newest and [getattr(newest, f.attname) for f in JobAttempt._meta.concrete_fields],
        int(now.timestamp() // REVISION_PERIOD_S),
    ]
    return hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest(), newest
