"""Counters that every process of the control plane adds to and /metrics
reads (controlplane/monitoring.py).

Web processes, Celery workers and beat are separate processes (several per
host, several hosts), so an in-process Prometheus registry would show one
process's share. The counters live in one Redis hash instead: a field per
series, added to with HINCRBYFLOAT, read whole at scrape time. Telemetry
never fails the work it counts: an unreachable Redis loses the increment.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading

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


# count_soon's sums not yet sent, and the timer that sends them.
FLUSH_AFTER_S = 1.0
_pending: dict[str, float] = {}
_pending_lock = threading.Lock()
_timer: threading.Timer | None = None


def count_soon(name: str, amount: float = 1.0, **labels: str) -> None:
    """As `count`, for the hottest path (every metric batch, hundreds a
    second a process): the adds are summed in the process and sent one
    second after the first of them, in one round trip, instead of one
    round trip each (a tenth of a batch of 10's CPU). A scrape flushes its
    own process first; another process's sums reach Redis within the
    second, and are lost only if it dies inside it."""
    global _timer
    field = _field(name, labels)
    with _pending_lock:
        _pending[field] = _pending.get(field, 0.0) + amount
        if _timer is None:
            _timer = threading.Timer(FLUSH_AFTER_S, flush)
            _timer.daemon = True
            _timer.start()


def flush() -> None:
    """Send count_soon's sums now."""
    global _timer
    with _pending_lock:
        sums = dict(_pending)
        _pending.clear()
        _timer = None
    if not sums:
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for field, amount in sums.items():
            pipe.hincrbyfloat(KEY, field, amount)
        pipe.execute()
    except redis.RedisError as exc:
        log.debug("telemetry %s not counted: %s", sorted(sums), exc)


def _forget_in_child() -> None:
    # A forked child has no timer thread, whatever the parent had: its own
    # first add starts one. The parent's sums are the parent's to send.
    global _pending_lock, _timer
    _pending_lock = threading.Lock()
    _pending.clear()
    _timer = None


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(flush)


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
    """Every series: {name: [(labels, value), ...]}; empty if Redis is down.
    This process's count_soon sums are sent first."""
    flush()
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
