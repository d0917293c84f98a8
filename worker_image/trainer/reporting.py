"""Reporting to the control plane from a background thread.

The training loop only ever appends to bounded deques or sets attributes;
the thread does the HTTP with short timeouts and backs off while the control
plane is away, so a slow or absent control plane costs a step nothing.
Without REGATTA_URL/REGATTA_TOKEN the trainer gets a `NullReporter`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import requests

log = logging.getLogger("trainer.reporting")

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 5.0
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
    def close(self, timeout_s: float = 5.0) -> None: ...

    def directives(self) -> dict[str, Any]:
        return {}


class Reporter(NullReporter):
    enabled = True

    def __init__(self, url: str, token: str, attempt_id: str, rank: int, node: str,
                 heartbeat_interval_s: float, gpu_stats=None, max_metrics: int = 10_000,
                 max_events: int = 1_000):
        self.base = f"{url.rstrip('/')}/api/v1/worker/attempts/{attempt_id}"
        self.rank = rank
        self.node = node
        self.interval = heartbeat_interval_s
        self.gpu_stats = gpu_stats or (lambda: None)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        # deque(maxlen) drops the oldest metric when full: newest data matters most.
        self.metrics: collections.deque = collections.deque(maxlen=max_metrics)
        # Events and checkpoint reports are rarer and matter more; they are
        # bounded too but kept in order, ahead of metrics.
        self.urgent: collections.deque = collections.deque(maxlen=max_events)
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
        self.dropped_metrics = 0
        self.sent = collections.Counter()

    # -- called from the training loop: never blocks --------------------------
    def start(self) -> None:
        self._thread.start()

    def update_status(self, **status: Any) -> None:
        self.status = {**self.status, **status}

    def metric(self, name: str, step: int, value: float) -> None:
        if len(self.metrics) == self.metrics.maxlen:
            self.dropped_metrics += 1
        self.metrics.append({"rank": self.rank, "name": name, "step": step,
                             "value": float(value), "time": time.time()})

    def event(self, kind: str, message: str = "", data: dict | None = None) -> None:
        self.urgent.append(("events", {"kind": kind, "rank": self.rank, "message": message,
                                       "data": data or {}}))
        self._wake.set()

    def checkpoint(self, payload: dict) -> None:
        self.urgent.append(("checkpoints", payload))
        self._wake.set()

    def directives(self) -> dict[str, Any]:
        return self._directives

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, giving it up to `timeout_s` to deliver what is queued."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

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
                except (requests.RequestException, ValueError) as exc:
                    self._backoff = min(MAX_BACKOFF_S, max(0.5, self._backoff * 2))
                    self._retry_at = time.monotonic() + self._backoff
                    log.debug("control plane unreachable (%s); retry in %.1fs", exc, self._backoff)
                    if stopping:
                        return
            if stopping and not self.urgent and not self.metrics:
                return
            wait = max(0.05, min(self._next_heartbeat, self._retry_at) - time.monotonic())
            self._wake.wait(min(wait, self.interval))
            self._wake.clear()

    def _post(self, endpoint: str, body: dict) -> dict:
        resp = self.session.post(f"{self.base}/{endpoint}", json=body,
                                 timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        if resp.status_code in (401, 403, 404, 400, 422):
            # A permanent refusal: retrying will not help, so drop the item.
            log.warning("control plane refused %s: %s %s", endpoint, resp.status_code,
                        resp.text[:200])
            self.sent[f"{endpoint}_refused"] += 1
            return {}
        resp.raise_for_status()
        self.sent[endpoint] += 1
        return resp.json() if resp.content else {}

    def _heartbeat(self) -> None:
        body = {"rank": self.rank, "node": self.node, **self.status, "gpu": self.gpu_stats()}
        reply = self._post("heartbeat", body)
        directives = reply.get("directives") if isinstance(reply, dict) else None
        if isinstance(directives, dict):
            self._directives = directives

    def _drain(self) -> None:
        while self.urgent:
            endpoint, body = self.urgent[0]
            self._post(endpoint, body)
            self.urgent.popleft()
        while self.metrics:
            n = min(len(self.metrics), METRICS_PER_BATCH)
            points = [self.metrics[i] for i in range(n)]
            # The id only moves on after a success, so a retried batch keeps it.
            self._post("metrics", {"batch_id": f"r{self.rank}-{self._batch_seq}",
                                   "points": points})
            self._batch_seq += 1
            for _ in range(n):
                if self.metrics:
                    self.metrics.popleft()
            if not self._stop.is_set() and time.monotonic() >= self._next_heartbeat:
                return


def from_env(env: dict[str, str], rank: int, heartbeat_interval_s: float,
             gpu_stats=None) -> NullReporter:
    url, token = env.get("REGATTA_URL"), env.get("REGATTA_TOKEN")
    if not url or not token:
        return NullReporter()
    return Reporter(url, token, env.get("REGATTA_ATTEMPT_ID", "0"), rank,
                    env.get("REGATTA_NODE", ""), heartbeat_interval_s, gpu_stats)
