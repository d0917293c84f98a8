"""A ledger's totals: GPU time per category and the goodput ratio."""

from django.db.models import Sum

from jobs.goodput.models import GoodputEntry


def goodput_totals(entries) -> dict:
    """Sum a GoodputEntry queryset per category; every category appears."""
    totals = {c: {"seconds": 0.0, "gpu_seconds": 0.0} for c in GoodputEntry.Category.values}
    rows = entries.values("category").annotate(s=Sum("seconds"), g=Sum("gpu_seconds"))
    for row in rows:
        totals[row["category"]] = {"seconds": row["s"] or 0.0, "gpu_seconds": row["g"] or 0.0}
    total_gpu = sum(v["gpu_seconds"] for v in totals.values())
    productive = totals[GoodputEntry.Category.PRODUCTIVE]["gpu_seconds"]
    # Evaluation runs' GPU time is in the totals but not in training's
    # ratio: it is neither productive training nor training lost.
    training_gpu = total_gpu - totals[GoodputEntry.Category.EVAL]["gpu_seconds"]
    return {
        "categories": totals,
        "total": {
            "seconds": sum(v["seconds"] for v in totals.values()),
            "gpu_seconds": total_gpu,
        },
        "goodput_ratio": (productive / training_gpu) if training_gpu else None,
    }
