"""What the job page shows beside its charts: attempts, checkpoints, goodput,
the checkpoint interval and the preflight bandwidth.

The page re-renders these tables on every poll, so each is bounded: a job
that ran for weeks has thousands of checkpoints and may have hundreds of
attempts, and a poll must cost the same for it as for a new one. The full
lists live on their own paginated pages (views.jobs.job_checkpoints,
job_attempts), which are not polled.
"""

from django.db.models import Count

from checkpoints.models import Checkpoint
from jobs import goodput as ledger
from jobs.models import GoodputEntry, TrainingJob

EVENT_LIMIT = 200
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
    """Each time the job was preempted or reclaimed (jobs/reconcile/evict.py),
    newest first: by which job, the checkpoint it saved, what it lost."""
    rows = job.events.filter(kind="Preempted").order_by("-created_at", "-id")[:EVENT_LIMIT]
    return [{"at": e.created_at, "message": e.message, **(e.evidence or {})} for e in rows]


def evals(job: TrainingJob) -> list[dict]:
    """The job's newest eval runs (jobs/evals.py), by checkpoint step, with
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


def latest_preflight(job: TrainingJob) -> dict:
    """The newest attempt's preflight, with its all-reduce bandwidth in GB/s.

    Providers report it either whole (`allreduce_gbps`) or per node under
    `allreduce` (the local provider: each node's `busbw_gbps`); the gang runs
    at its slowest node's pace, so the minimum is what counts. A launch that
    skipped the check (its nodes had all passed recently) measured nothing:
    the newest check that ran is shown instead, when there is one.
    """
    reports = job.attempts.exclude(preflight={}).order_by("-number").only("number", "preflight")
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
