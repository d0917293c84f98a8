"""The team page's figures: quota usage, and GPU-hours used and lost."""

from jobs.models import GoodputEntry, Team

from .jobdetail import goodput

PRODUCTIVE = GoodputEntry.Category.PRODUCTIVE
QUEUED = GoodputEntry.Category.QUEUED


def quotas(team: Team) -> list[dict]:
    return [
        {"quota": q, **q.usage()}
        for q in team.quotas.select_related("cluster").order_by("cluster__name")
    ]


def gpu_hours(team: Team) -> dict:
    """The team's goodput ledger: productive hours against hours lost.

    Queueing holds no GPUs, so it is shown but counted neither way.
    """
    rows = goodput(GoodputEntry.objects.filter(job__team=team))
    used = sum(r["gpu_hours"] for r in rows if r["category"] == PRODUCTIVE)
    lost = sum(r["gpu_hours"] for r in rows if r["category"] not in (PRODUCTIVE, QUEUED))
    held = used + lost
    return {
        "rows": rows,
        "productive": used,
        "lost": lost,
        "goodput_pct": (100.0 * used / held) if held else None,
    }
