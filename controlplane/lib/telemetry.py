"""Counters that every process of the control plane adds to and /metrics
reads (controlplane/monitoring.py).

Web processes, Celery workers and beat are separate processes (several per
host, several hosts), so an in-process Prometheus registry would show one
process's share. The counters live in one Redis hash instead: a field per
series, added to with HINCRBYFLOAT, read whole at scrape time. Telemetry
never fails the work it counts: an unreachable Redis loses the increment.
"""

from __future__ import annotations

import json
import logging

import redis

from controlplane.redis_client import get_redis

log = logging.getLogger(__name__)

KEY = "regatta:telemetry"
# Reconcile pass durations, in seconds: the histogram's upper bounds.
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _field(name: str, labels: dict) -> str:
    return name + json.dumps(labels, sort_keys=True, separators=(",", ":"))


def count(name: str, amount: float = 1.0, **labels: str) -> None:
    """Add `amount` to the counter `name` with these labels."""
    try:
        get_redis().hincrbyfloat(KEY, _field(name, labels), amount)
    except redis.RedisError as exc:
        log.debug("telemetry %s not counted: %s", name, exc)


def observe(name: str, seconds: float, **labels: str) -> None:
    """One observation of a duration: the histogram's buckets, sum and count."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        for bound in BUCKETS:
            if seconds <= bound:
                pipe.hincrbyfloat(KEY, _field(name + "_bucket", {**labels, "le": str(bound)}), 1)
        pipe.hincrbyfloat(KEY, _field(name + "_bucket", {**labels, "le": "+Inf"}), 1)
        pipe.hincrbyfloat(KEY, _field(name + "_sum", labels), seconds)
        pipe.hincrbyfloat(KEY, _field(name + "_count", labels), 1)
        pipe.execute()
    except redis.RedisError as exc:
        log.debug("telemetry %s not observed: %s", name, exc)


def read() -> dict[str, list[tuple[dict, float]]]:
    """Every series: {name: [(labels, value), ...]}; empty if Redis is down."""
    try:
        raw = get_redis().hgetall(KEY)
    except redis.RedisError as exc:
        log.warning("telemetry unreadable: %s", exc)
        return {}
    out: dict[str, list[tuple[dict, float]]] = {}
    for field, value in raw.items():
        text = field.decode()
        brace = text.index("{")
        out.setdefault(text[:brace], []).append((json.loads(text[brace:]), float(value)))
    return out
