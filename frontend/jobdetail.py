"""What the job page shows beside its charts: attempts, checkpoints, goodput,
the checkpoint interval and the preflight bandwidth."""

from django.db.models import Sum

from checkpoints.models import Checkpoint
from jobs.models import GoodputEntry, TrainingJob

EVENT_LIMIT = 200
GOODPUT_ORDER = [c.value for c in GoodputEntry.Category]
GOODPUT_LABELS = dict(GoodputEntry.Category.choices)


def attempts(job: TrainingJob):
    return job.attempts.prefetch_related("placements__node").select_related("resumed_from")


def checkpoints(job: TrainingJob):
    return job.checkpoints.order_by("-step")


def restartable_steps(job: TrainingJob) -> list[int]:
    return list(
        job.checkpoints.filter(state__in=Checkpoint.LOADABLE)
        .order_by("-step").values_list("step", flat=True)
    )


def events(job: TrainingJob):
    """The newest events, shown newest first."""
    return job.events.select_related("attempt").order_by("-created_at", "-id")[:EVENT_LIMIT]


def goodput(entries) -> list[dict]:
    """Ledger rows summed per category, in the ledger's category order."""
    sums = {
        row["category"]: row
        for row in entries.values("category").annotate(s=Sum("seconds"), g=Sum("gpu_seconds"))
    }
    total = sum((row["g"] or 0.0) for row in sums.values()) or 0.0
    out = []
    for cat in GOODPUT_ORDER:
        row = sums.get(cat)
        if row is None:
            continue
        gpu_s = row["g"] or 0.0
        out.append({
            "category": cat, "label": GOODPUT_LABELS[cat], "seconds": row["s"] or 0.0,
            "gpu_seconds": gpu_s, "gpu_hours": gpu_s / 3600.0,
            "share": (gpu_s / total) if total else 0.0,
        })
    return out


def job_goodput(job: TrainingJob) -> list[dict]:
    return goodput(GoodputEntry.objects.filter(job=job))


def latest_preflight(job: TrainingJob) -> dict:
    """The newest attempt's preflight, with its all-reduce bandwidth in GB/s.

    Providers report it either whole (`allreduce_gbps`) or per node under
    `allreduce` (the local provider: each node's `busbw_gbps`); the gang runs
    at its slowest node's pace, so the minimum is what counts.
    """
    attempt = job.attempts.exclude(preflight={}).order_by("-number").first()
    if attempt is None:
        return {}
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
