"""Whether a web process was there to hear the ranks' heartbeats.

Every heartbeat goes to the web. While the web is away (a restart, a
deploy, a crash and its respawn), no rank of any job is heard, and a
heartbeat deadline that kept counting would call every running job hung and
restart it, work lost, on the control plane's own fault (what the SDK's
buffering keeps the metrics safe from). So each web process marks in Redis
that it is listening, every MARK_EVERY_S, and the hang detector
(jobs/recovery/detect.py) counts a rank's silence only from the moment the
web was last back, and not at all while no web is listening.

Two keys, kept without expiry so that an outage leaves them behind:
`alive_at`, the newest mark, and `since`, the start of the current unbroken
run of marks (a mark that finds `alive_at` older than GAP_S starts a new
run). A control plane whose web never marked (tests that call the
reconciler directly, a web server started on `controlplane.wsgi:application`
rather than the `serve` factory) has neither, and the detector judges as
before.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from controlplane.redis_client import get_redis

log = logging.getLogger(__name__)

ALIVE_AT = "regatta:web:alive_at"
SINCE = "regatta:web:since"
MARK_EVERY_S = 2.0
# Marks further apart than this mean the web was away in between.
GAP_S = 3 * MARK_EVERY_S

_marking: threading.Event | None = None
_start_lock = threading.Lock()


def mark(now: float) -> None:
    """One mark: the web is listening at `now` (Unix seconds)."""
    r = get_redis()
    last = r.get(ALIVE_AT)
    pipe = r.pipeline()
    if last is None or now - float(last) > GAP_S:
        pipe.set(SINCE, repr(now))
    pipe.set(ALIVE_AT, repr(now))
    pipe.execute()


def listening(now: float) -> tuple[bool, float | None]:
    """(known, since): whether any web ever marked, and since when one has
    been listening without a break (None while none is listening now)."""
    try:
        alive_at, since = get_redis().mget(ALIVE_AT, SINCE)
    except redis.RedisError as exc:
        log.warning("web liveness unknown (%s); heartbeat deadlines count as before", exc)
        return False, None
    if alive_at is None or since is None:
        return False, None
    if now - float(alive_at) > GAP_S:
        return True, None
    return True, float(since)


def _loop(stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            mark(time.time())
        except redis.RedisError as exc:
            log.warning("web liveness not marked: %s", exc)
        stop.wait(MARK_EVERY_S)


def start_marking() -> threading.Event:
    """Mark from this (web) process until the returned event is set: for
    the process's life, where nobody sets it (controlplane.wsgi.serve). One
    marking thread a process, however often it is asked."""
    global _marking
    with _start_lock:
        if _marking is None or _marking.is_set():
            _marking = threading.Event()
            threading.Thread(target=_loop, args=(_marking,), name="regatta-web-liveness",
                             daemon=True).start()
        return _marking
