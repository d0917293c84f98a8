"""Reporting to the control plane from a background thread (standard library only).

The training loop only ever appends to bounded queues (holding a lock for
just the append) or sets attributes; the thread does the HTTP with short
timeouts and backs off while the control plane is away, so a slow or absent
control plane costs a step nothing. What a full queue drops is counted and
reported (a `reports_dropped` event), never lost in silence.
Without REGATTA_URL/REGATTA_TOKEN a run gets a `NullReporter`.

A metric's value may be a *deferred* value (anything with `ready()` and
`get()`, e.g. regatta.run's wrapper of a CUDA tensor being copied to the
host): the thread sends a point only once its value is ready, so logging a
loss tensor never makes the training loop wait for the GPU.

HTTP is `http.client` with one kept-alive connection per reporter (the
worker endpoints are hit every few seconds by every rank): no `requests`, so
the SDK adds nothing to a training image but itself.
"""

from __future__ import annotations

import collections
import http.client
import itertools
import json
import logging
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("regatta.reporting")

TIMEOUT_S = 5.0
MAX_BACKOFF_S = 30.0
METRICS_PER_BATCH = 500


class NullReporter:
    """Reporting switched off: every call is a no-op."""

    enabled = False

    def start(self) -> None: ...
    def update_status(self, **status: Any) -> None: ...
    def metric(self, name: str, step: int, value: float) -> None: ...
    def event(self, kind: str, message: str = "", data: dict | None = None) -> None: ...
    def checkpoint(self, payload: dict) -> None: ...
    def profile(self, payload: dict) -> None: ...
    def close(self, timeout_s: float = 5.0) -> None: ...

    def pending(self) -> int:
        return 0

    def directives(self) -> dict[str, Any]:
        return {}


class Reporter(NullReporter):
    enabled = True

    def __init__(self, url: str, token: str, attempt_id: str, rank: int, node: str,
                 heartbeat_interval_s: float, gpu_stats=None, max_metrics: int = 10_000,
                 max_events: int = 1_000, job_id: str = ""):
        self.http = _Http(url, token)
        self.base = f"/api/v1/worker/attempts/{attempt_id}"
        self.rank = rank
        self.node = node
        self.job_id = job_id
        # Batch ids name the job and attempt too, so two attempts' batches
        # never share an id in a log or a proxy's cache.
        self._batch_prefix = f"j{job_id or '?'}-a{attempt_id}-r{rank}"
        # Each event's idempotency key: a resent event (its reply lost to a
        # timeout or a restarting web) is stored once. The random part keeps
        # two reporters of one rank apart (`report_once` runs its own).
        self._key_prefix = f"{self._batch_prefix}-{os.urandom(4).hex()}"
        self._event_seq = itertools.count()
        self.interval = heartbeat_interval_s
        self.gpu_stats = gpu_stats or (lambda: None)
        self.max_metrics = max_metrics
        self.max_events = max_events
        # The training thread appends and the reporting thread takes, so every
        # touch of the two queues (and of the drop counters) holds this lock.
        # An item leaves its queue under the lock *before* it is posted and is
        # kept aside until the control plane acknowledged it: an overflow can
        # then only ever drop queued items, never the one in flight, and a
        # retried metric batch is the same batch_id with the same points.
        self._lock = threading.Lock()
        self.metrics: collections.deque = collections.deque()
        # Events and checkpoint reports are rarer and matter more: sent first,
        # in order, bounded too.
        self.urgent: collections.deque = collections.deque()
        self._metric_batch: dict | None = None
        self._urgent_item: tuple[str, dict] | None = None
        self.dropped: collections.Counter = collections.Counter()
        self._dropped_reported: dict[str, int] = {}
        self.status: dict[str, Any] = {"step": 0, "samples_per_s": 0.0, "tokens_per_s": 0.0,
                                       "step_time_s": 0.0}
        self._directives: dict[str, Any] = {}
        self._batch_seq = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="regatta-reporter", daemon=True)
        self._next_heartbeat = 0.0
        self._backoff = 0.0
        self._retry_at = 0.0
        self.sent = collections.Counter()

    # -- called from the training loop: never blocks on the network -------------
    def start(self) -> None:
        self._thread.start()

    def update_status(self, **status: Any) -> None:
        self.status = {**self.status, **status}

    def metric(self, name: str, step: int, value: Any) -> None:
        """`value`: a number, or a deferred value (`ready()`, `get()`)."""
        if not hasattr(value, "ready"):
            value = float(value)
        point = {"rank": self.rank, "name": name, "step": step, "value": value,
                 "time": time.time()}
        with self._lock:
            if len(self.metrics) >= self.max_metrics:
                # The oldest goes: the newest points say most about the run now.
                self.metrics.popleft()
                self._count_drop("metrics")
            self.metrics.append(point)

    def event(self, kind: str, message: str = "", data: dict | None = None) -> None:
        self._urgent(("events", {"kind": kind, "rank": self.rank, "message": message,
                                 "data": data or {}, "job_id": self.job_id,
                                 "key": f"{self._key_prefix}-{next(self._event_seq)}"}))

    def checkpoint(self, payload: dict) -> None:
        self._urgent(("checkpoints", {**payload, "job_id": self.job_id}))

    def profile(self, payload: dict) -> None:
        """A profiler trace this rank wrote (regatta/profiling.py)."""
        self._urgent(("profiles", {**payload, "job_id": self.job_id}))

    def _urgent(self, item: tuple[str, dict]) -> None:
        with self._lock:
            if len(self.urgent) >= self.max_events:
                self._drop_one_urgent()
            self.urgent.append(item)
        self._wake.set()

    def _drop_one_urgent(self) -> None:
        # An event goes before a checkpoint report: the control plane can
        # rebuild a lost report from storage, but it cannot guess an event.
        # Called with the lock held.
        victim = next((i for i, (kind, _) in enumerate(self.urgent) if kind == "events"), 0)
        endpoint, _ = self.urgent[victim]
        del self.urgent[victim]
        self._count_drop(endpoint)

    def _count_drop(self, what: str) -> None:
        if not self.dropped[what]:
            log.warning("reporting buffer full: dropping %s until the control plane "
                        "catches up (the count is reported)", what)
        self.dropped[what] += 1

    def directives(self) -> dict[str, Any]:
        return self._directives

    def pending(self) -> int:
        """Items not yet acknowledged by the control plane (queued or in flight)."""
        with self._lock:
            return (len(self.metrics) + len(self.urgent)
                    + (len(self._metric_batch["points"]) if self._metric_batch else 0)
                    + (1 if self._urgent_item else 0))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, giving it up to `timeout_s` to deliver what is queued."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        left = self.pending()
        if left or self.dropped:
            log.warning("reporting closed with %d items undelivered; dropped while "
                        "full: %s", left, dict(self.dropped) or "none")

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            now = time.monotonic()
            if now >= self._retry_at:
                try:
                    if not stopping and now >= self._next_heartbeat:
                        self._heartbeat()
                        self._next_heartbeat = time.monotonic() + self.interval
                    self._drain()
                    self._backoff = 0.0
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    self._backoff = min(MAX_BACKOFF_S, max(0.5, self._backoff * 2))
                    self._retry_at = time.monotonic() + self._backoff
                    log.debug("control plane unreachable (%s); retry in %.1fs", exc, self._backoff)
                    if stopping:
                        return
            if stopping and not self.pending() and not self._drops_unreported():
                return
            wait = max(0.05, min(self._next_heartbeat, self._retry_at) - time.monotonic())
            self._wake.wait(min(wait, self.interval))
            self._wake.clear()

    def _post(self, endpoint: str, body: dict) -> dict:
        status, data = self.http.post(f"{self.base}/{endpoint}", body)
        if status in (401, 403, 404, 400, 413, 422):
            # A permanent refusal: retrying will not help, so drop the item.
            log.warning("control plane refused %s: %s %s", endpoint, status, data[:200])
            self.sent[f"{endpoint}_refused"] += 1
            return {}
        if status >= 300:
            raise http.client.HTTPException(f"{endpoint}: HTTP {status}")
        # The backoff counts failures in a row: one answer proves the control
        # plane is there, even if the round as a whole fails later.
        self._backoff = 0.0
        self.sent[endpoint] += 1
        return json.loads(data) if data else {}

    def _heartbeat(self) -> None:
        body = {"rank": self.rank, "node": self.node, **self.status, "gpu": self.gpu_stats(),
                "job_id": self.job_id}
        reply = self._post("heartbeat", body)
        directives = reply.get("directives") if isinstance(reply, dict) else None
        if isinstance(directives, dict):
            self._directives = directives

    def _take_urgent(self) -> tuple[str, dict] | None:
        with self._lock:
            if self._urgent_item is None and self.urgent:
                self._urgent_item = self.urgent.popleft()
            return self._urgent_item

    def _take_metric_batch(self) -> dict | None:
        with self._lock:
            if self._metric_batch is None and self.metrics:
                points = []
                # In order, up to the first value still on its way to the host.
                while self.metrics and len(points) < METRICS_PER_BATCH \
                        and _resolve(self.metrics[0]):
                    points.append(self.metrics.popleft())
                if not points:
                    return None
                self._metric_batch = {
                    "batch_id": f"{self._batch_prefix}-{self._batch_seq}",
                    "job_id": self.job_id,
                    "points": points,
                }
                self._batch_seq += 1
            return self._metric_batch

    def _drops_unreported(self) -> dict[str, int]:
        with self._lock:
            totals = {k: v for k, v in self.dropped.items() if v}
        return totals if totals != self._dropped_reported else {}

    def _drain(self) -> None:
        while (item := self._take_urgent()) is not None:
            endpoint, body = item
            self._post(endpoint, body)
            with self._lock:
                self._urgent_item = None
        # Once the queue has room again, say how much it lost: running totals,
        # sent straight (not queued), so this report cannot itself be dropped.
        if totals := self._drops_unreported():
            self._post("events", {
                "kind": "reports_dropped", "rank": self.rank, "job_id": self.job_id,
                "message": "reporting buffer overflowed while the control plane was away: "
                           + ", ".join(f"{n} {what}" for what, n in sorted(totals.items())),
                "data": totals,
                # Running totals only grow: the same totals are the same report.
                "key": f"{self._key_prefix}-dropped-{sum(totals.values())}"})
            self._dropped_reported = totals
        while (batch := self._take_metric_batch()) is not None:
            self._post("metrics", batch)
            with self._lock:
                self._metric_batch = None
            if not self._stop.is_set() and time.monotonic() >= self._next_heartbeat:
                return


def _resolve(point: dict) -> bool:
    """Turn a ready deferred value into a float in place; False if not ready."""
    value = point["value"]
    if isinstance(value, float):
        return True
    if not value.ready():
        return False
    point["value"] = float(value.get())
    return True


class _Http:
    """One kept-alive HTTP/1.1 connection, opened again after any failure."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.scheme, self.netloc = parts.scheme, parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}",
                        "Content-Type": "application/json", "Connection": "keep-alive"}
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        if self.conn is None:
            cls = (http.client.HTTPSConnection if self.scheme == "https"
                   else http.client.HTTPConnection)
            self.conn = cls(self.netloc, timeout=TIMEOUT_S)
        try:
            self.conn.request("POST", self.prefix + path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            payload = resp.read()
        except BaseException:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return resp.status, payload

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def from_env(env, rank: int, heartbeat_interval_s: float,
             gpu_stats=None) -> NullReporter:
    url, token = env.get("REGATTA_URL"), env.get("REGATTA_TOKEN")
    if not url or not token:
        return NullReporter()
    return Reporter(url, token, env.get("REGATTA_ATTEMPT_ID", "0"), rank,
                    env.get("REGATTA_NODE", ""), heartbeat_interval_s, gpu_stats,
                    job_id=env.get("REGATTA_JOB_ID", ""))


def report_once(env, rank: int, kind: str, message: str, data: dict) -> None:
    """Send one event from a reporter of its own, for exits before a run's
    reporter exists; a no-op without a control plane."""
    reporter = from_env(env, rank, 1.0)
    reporter.event(kind, message, data)
    reporter.start()
    reporter.close(timeout_s=3.0)
