"""The team page's figures: quota usage, and GPU-hours held and lost."""

from jobs.admission import quota_usage
from jobs.goodput.models import GoodputEntry
from jobs.models import Team

from .jobdetail import ledger_view


def quotas(team: Team) -> list[dict]:
    rows = list(team.quotas.select_related("cluster").order_by("cluster__name"))
    usage = quota_usage(rows)
    return [{"quota": q, **usage[q.pk]} for q in rows]


def gpu_hours(team: Team) -> dict:
    """The team's goodput ledger over all its jobs: GPU-hours held (every
    category but queueing), of which productive and lost (rollback, restart
    latency, hang, checkpoint stalls)."""
    return ledger_view(GoodputEntry.objects.filter(job__team=team))
