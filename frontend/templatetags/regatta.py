import json

from django import template
from django.utils import timezone

from jobs.models import Phase

register = template.Library()
# Phases in which a job is on its way to running and may be held up.
WAITING_PHASES = (Phase.PENDING, Phase.QUEUED, Phase.ADMITTED, Phase.STARTING, Phase.RESTARTING)


@register.filter
def pretty_json(value) -> str:
    """Evidence, labels, hyperparameters as a person reads them: a key with
    no value is left out (JSON's `null` means nothing to a reader), and an
    empty place in a list says so."""
    return json.dumps(_without_nulls(value), indent=2, sort_keys=True, default=str)


def _without_nulls(value):
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return ["(none)" if v is None else _without_nulls(v) for v in value]
    return value


@register.filter
def duration(seconds) -> str:
    """1h 02m, 3m 05s, 42.0s, 0.05s: short enough for a table cell."""
    if seconds is None or seconds == "":
        return "—"
    s = float(seconds)
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    minutes, sec = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@register.filter
def filesize(num) -> str:
    n = float(num or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@register.filter
def percent(value, total) -> int:
    try:
        return max(0, min(100, round(100 * float(value) / float(total))))
    except (TypeError, ValueError, ZeroDivisionError):
        return 0


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key)


@register.filter
def age(when) -> str:
    """12s, 5m, 3h, 2d: Django's timesince says "0 minutes" for anything
    under a minute, which reads as broken on a page that updates live."""
    if not when:
        return "—"
    secs = max(0, int((timezone.now() - when).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


@register.filter
def ago(when) -> str:
    return f"{age(when)} ago" if when else "—"


@register.filter
def ran(attempt) -> float | None:
    """Seconds an attempt ran: to its end, or until now while it runs."""
    if attempt.started_at is None:
        return None
    end = attempt.ended_at or timezone.now()
    return max(0.0, (end - attempt.started_at).total_seconds())


@register.filter
def waiting(job) -> str:
    """Why a job that is not running yet (or again) waits, or "".

    The scheduler's pending reason covers pending, queued and a requeue; a
    restart that backs off after a transient failure says so through its
    RestartBackoff condition, whose `until` is a Unix time.
    """
    if job.phase not in WAITING_PHASES:
        return ""
    if job.pending_reason:
        return job.pending_reason
    for cond in job.conditions or []:
        if cond.get("type") == "RestartBackoff" and isinstance(cond.get("until"), int | float):
            left = cond["until"] - timezone.now().timestamp()
            if left > 0:
                return f"backing off after a transient failure; retrying in {left:.0f}s"
    return ""


# Phases in which a relaunch after a failure is under way: the error that
# ended the attempt before still explains what the job is doing.
RELAUNCHING = (Phase.QUEUED, Phase.ADMITTED, Phase.STARTING)


@register.filter
def current_error(job) -> dict | None:
    """The job's `last_error` while it applies, as (label, text): the error
    that failed the job, that it restarts from, or that a reconcile pass
    keeps meeting; the previous attempt's end while the next one is being
    launched. Once the job runs again, succeeds or is cancelled the error
    is history, and the timeline keeps it."""
    if not job.last_error:
        return None
    failing = any(c.get("type") == "ReconcileError" for c in job.conditions or [])
    if failing or job.phase in (Phase.FAILED, Phase.RESTARTING):
        return {"label": "Last error", "text": job.last_error, "bad": True}
    if job.phase in RELAUNCHING and job.attempts.exists():
        return {"label": "The previous attempt ended with", "text": job.last_error,
                "bad": False}
    return None


@register.filter
def placed(attempt, job) -> dict:
    """Where the provider put the attempt's gang: each rank's node, with the
    GPUs it holds where the provider names them (a local GPU pool's node
    label `regatta/gpus`), and the gang's shape; on a local CPU pool the
    ranks run on the CPU (gloo), which the shape says."""
    nodes = []
    for p in sorted(attempt.placements.all(), key=lambda p: p.node_rank):
        gpus = str((p.node.labels or {}).get("regatta/gpus", ""))
        nodes.append({"rank": p.node_rank, "node": p.node, "gpus": gpus})
    per_node = job.gpus_per_node
    shape = f"{len(nodes)} × {per_node} GPU{'' if per_node == 1 else 's'}"
    pool = job.pool
    if pool is not None and (pool.settings or {}).get("devices") == "cpu":
        shape += " (CPU, gloo)"
    return {"nodes": nodes, "shape": shape}
