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

Nothing a rank reports is lost to a control plane that restarts: past the
memory bound the oldest items move to local disk, and what is still
undelivered when the reporter closes (after a bounded wait) is handed off
into the job's storage, where the control plane collects it
(regatta/spool.py). Events carry an idempotency key, so neither a retry nor
a hand-off stores one twice.
"""

from __future__ import annotations

import collections
import http.client
import itertools
import json
import logging
import os
import random
import threading
import time
from typing import Any

from . import contract, spool
from .transport import Http

log = logging.getLogger("regatta.reporting")

# Retries back off to at most one heartbeat interval (within these bounds):
# a rank never retries more often than it beats anyway, and the control
# plane hears from it within one interval of coming back, long before its
# heartbeat deadline (a 30 s backoff after a one-minute web restart read as
# a hang).
MAX_BACKOFF_S = 30.0
MIN_MAX_BACKOFF_S = 1.0
METRICS_PER_BATCH = 500
METRICS = contract.METRIC_BATCH.endpoint


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
                 max_events: int = 1_000, job_id: str = "", handoff=None,
                 max_spool_bytes: int = spool.MAX_SPOOL_BYTES):
        self.http = Http(url, token)
        self.base = f"/api/v1/worker/attempts/{attempt_id}"
        self.attempt_id = attempt_id
        self.rank = rank
        self.node = node
        self.job_id = job_id
        # Batch ids name the job and attempt too, so two attempts' batches
        # never share an id in a log or a proxy's cache.
        self._batch_prefix = f"j{job_id or '?'}-a{attempt_id}-r{rank}"
        # Each event's idempotency key: a resent event (its reply lost to a
        # timeout or a restarting web) is stored once. The random part keeps
        # two reporters of one rank apart (`report_once` runs its own).
        self._tag = os.urandom(4).hex()
        self._key_prefix = f"{self._batch_prefix}-{self._tag}"
        self._event_seq = itertools.count()
        self.interval = heartbeat_interval_s
        self.gpu_stats = gpu_stats or (lambda: None)
        self.max_metrics = max_metrics
        self.max_events = max_events
        # handoff(key, data): where `close` leaves what it could not deliver
        # (regatta/spool.py); None: it is only counted in the log.
        self.handoff = handoff
        self.handed_off_to: str | None = None
        # The training thread appends and the reporting thread takes, so every
        # touch of the two queues' memory (and of the drop counters) holds
        # `_lock`. An item leaves its queue *before* it is posted and is kept
        # aside until the control plane acknowledged it: a retried metric
        # batch is the same batch_id with the same points. `_spool_lock`
        # (taken before `_lock`) covers the queues' disk part, which only the
        # reporting thread touches until `close` hands everything off.
        self._lock = threading.Lock()
        self._spool_lock = threading.Lock()
        self.metrics = spool.SpooledQueue(METRICS, max_metrics, max_spool_bytes)
        # Events and checkpoint reports are rarer and matter more: sent first,
        # in order, bounded too.
        self.urgent = spool.SpooledQueue("urgent", max_events, max_spool_bytes)
        self._metric_batch: dict | None = None
        self._urgent_item: tuple[str, dict] | None = None
        self._handed_off = False
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
        # Set by the training loop's first step, cleared by the thread as it
        # builds a heartbeat: a flag rather than a deadline, because a first
        # step that lands while a heartbeat is in flight must not be undone
        # by that heartbeat scheduling the next one an interval away.
        self._status_due = False
        self._backoff = 0.0
        self._max_backoff = min(MAX_BACKOFF_S, max(MIN_MAX_BACKOFF_S, heartbeat_interval_s))
        self._retry_at = 0.0
        self.sent = collections.Counter()

    # -- called from the training loop: never blocks on the network -------------
    def start(self) -> None:
        self._thread.start()

    def update_status(self, **status: Any) -> None:
        # A name the heartbeat does not have raises here, in the caller.
        status = contract.HEARTBEAT.build(**status)
        first_step = not self.status.get("step") and status.get("step")
        self.status = {**self.status, **status}
        if first_step:
            # The heartbeat that carries the first step is what marks the
            # attempt running (and ends its start-up in the goodput ledger):
            # sent now, not up to an interval later.
            self._status_due = True
            self._wake.set()

    def metric(self, name: str, step: int, value: Any) -> None:
        """`value`: a number, or a deferred value (`ready()`, `get()`)."""
        if not hasattr(value, "ready"):
            value = float(value)
        point = contract.METRIC_POINT.build(rank=self.rank, name=name, step=step, value=value,
                                            time=time.time())
        if len(self.metrics.memory) >= 2 * self.max_metrics:
            # The reporting thread is held up (a post to a slow or vanishing
            # control plane): this thread moves the overflow to disk itself,
            # a rare write of old points rather than a loss, unless the
            # reporting thread is at it already.
            self._spill(wait=False)
        with self._lock:
            if len(self.metrics.memory) >= 2 * self.max_metrics:
                # The reporting thread is spilling already and could not keep
                # up: the oldest goes, the newest say most about the run now.
                self.metrics.memory.popleft()
                self._count_drop(METRICS)
            self.metrics.memory.append((METRICS, point))
            over = self.metrics.over()
        if over:
            self._wake.set()

    def event(self, kind: str, message: str = "", data: dict | None = None) -> None:
        self._urgent((contract.EVENT.endpoint, contract.EVENT.build(
            kind=kind, rank=self.rank, message=message, data=data or {}, job_id=self.job_id,
            key=f"{self._key_prefix}-{next(self._event_seq)}")))

    def checkpoint(self, payload: dict) -> None:
        self._urgent((contract.CHECKPOINT.endpoint,
                      contract.CHECKPOINT.build(**payload, job_id=self.job_id)))

    def profile(self, payload: dict) -> None:
        """A profiler trace this rank wrote (regatta/profiling.py)."""
        self._urgent((contract.PROFILE.endpoint,
                      contract.PROFILE.build(**payload, job_id=self.job_id)))

    def _urgent(self, item: tuple[str, dict]) -> None:
        with self._lock:
            if len(self.urgent.memory) >= 2 * self.max_events:
                self._drop_one_urgent()
            self.urgent.memory.append(item)
        self._wake.set()

    def _drop_one_urgent(self) -> None:
        # An event goes before a checkpoint report: the control plane can
        # rebuild a lost report from storage, but it cannot guess an event.
        # Called with the lock held.
        memory = self.urgent.memory
        victim = next((i for i, (kind, _) in enumerate(memory)
                       if kind == contract.EVENT.endpoint), 0)
        endpoint, _ = memory[victim]
        del memory[victim]
        self._count_drop(endpoint)

    def _count_drop(self, what: str, n: int = 1) -> None:
        if not self.dropped[what]:
            log.warning("reporting buffer full: dropping %s until the control plane "
                        "catches up (the count is reported)", what)
        self.dropped[what] += n

    def directives(self) -> dict[str, Any]:
        return self._directives

    def pending(self) -> int:
        """Items not yet acknowledged by the control plane (queued, spooled
        or in flight)."""
        with self._lock:
            return (len(self.metrics) + len(self.urgent)
                    + (len(self._metric_batch["points"]) if self._metric_batch else 0)
                    + (1 if self._urgent_item else 0))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, giving it up to `timeout_s` to deliver what is
        queued; then hand off what is left (regatta/spool.py)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        left = self._hand_off()
        if left or self.dropped:
            log.warning("reporting closed with %d items undelivered (%s); dropped while "
                        "full: %s", left, self.handed_off_to or "lost: nowhere to hand them off",
                        dict(self.dropped) or "none")

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self._spill()
            now = time.monotonic()
            if now >= self._retry_at:
                try:
                    if not stopping and (self._status_due or now >= self._next_heartbeat):
                        # Due until delivered: a failed post is retried
                        # after the backoff, not an interval later.
                        self._status_due, self._next_heartbeat = False, 0.0
                        self._heartbeat()
                        self._next_heartbeat = time.monotonic() + self.interval
                    self._drain()
                    self._backoff = 0.0
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    self._backoff = min(self._max_backoff, max(0.5, self._backoff * 2))
                    if stopping:
                        # `close` bounds the wait: try again soon within it.
                        self._backoff = min(self._backoff, 1.0)
                    # Jitter: a fleet's ranks do not all come back in one instant.
                    self._retry_at = time.monotonic() + self._backoff * random.uniform(0.8, 1.0)
                    log.debug("control plane unreachable (%s); retry in %.1fs", exc, self._backoff)
            if self._handed_off or (
                    stopping and not self.pending() and not self._drops_unreported()):
                return
            wait = max(0.05, min(self._next_heartbeat, self._retry_at) - time.monotonic())
            self._wake.wait(min(wait, self.interval))
            self._wake.clear()

    def _spill(self, wait: bool = True) -> None:
        """Move the oldest of a queue past its bound in memory to disk; with
        `wait` false, only if no other thread is doing so."""
        if not self._spool_lock.acquire(blocking=wait):
            return
        try:
            self._spill_locked()
        finally:
            self._spool_lock.release()

    def _spill_locked(self) -> None:
        if self._handed_off:
            return
        for queue in (self.urgent, self.metrics):
            with self._lock:
                if not queue.over():
                    continue
                items = [queue.memory.popleft()
                         for _ in range(len(queue.memory) - queue.bound // 2)]
            # A deferred value is old by now: its copy to the host has landed.
            for _, body in items if queue is self.metrics else ():
                if not isinstance(body["value"], float):
                    body["value"] = float(body["value"].get())
            dropped = queue.spill(items)
            if dropped:
                with self._lock:
                    for what, n in dropped.items():
                        self._count_drop(what, n)

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
        body = contract.HEARTBEAT.build(rank=self.rank, node=self.node, **self.status,
                                        gpu=self.gpu_stats(), job_id=self.job_id)
        reply = self._post(contract.HEARTBEAT.endpoint, body)
        directives = reply.get("directives") if isinstance(reply, dict) else None
        if isinstance(directives, dict):
            self._directives = directives

    def _take_urgent(self) -> tuple[str, dict] | None:
        with self._spool_lock:
            if self._handed_off:
                return None
            self.urgent.refill()
            with self._lock:
                if self._urgent_item is None and self.urgent.head() is not None:
                    self._urgent_item = self.urgent.pop()
                return self._urgent_item

    def _take_metric_batch(self) -> dict | None:
        with self._spool_lock:
            if self._handed_off:
                return None
            self.metrics.refill(METRICS_PER_BATCH)
            with self._lock:
                if self._metric_batch is None:
                    points = []
                    # In order, up to the first value still on its way to the host.
                    while len(points) < METRICS_PER_BATCH \
                            and (item := self.metrics.head()) is not None and _resolve(item[1]):
                        points.append(self.metrics.pop()[1])
                    if not points:
                        return None
                    self._metric_batch = self._batch(points)
                return self._metric_batch

    def _batch(self, points: list) -> dict:
        self._batch_seq += 1
        return contract.METRIC_BATCH.build(batch_id=f"{self._batch_prefix}-{self._batch_seq - 1}",
                                           job_id=self.job_id, points=points)

    def _drops_unreported(self) -> dict[str, int]:
        with self._lock:
            totals = {k: v for k, v in self.dropped.items() if v}
        return totals if totals != self._dropped_reported else {}

    def _drops_report(self, totals: dict[str, int]) -> dict:
        return contract.EVENT.build(
            kind="reports_dropped", rank=self.rank, job_id=self.job_id,
            message="reporting buffer overflowed while the control plane was away: "
                    + ", ".join(f"{n} {what}" for what, n in sorted(totals.items())),
            data=totals,
            # Running totals only grow: the same totals are the same report.
            key=f"{self._key_prefix}-dropped-{sum(totals.values())}")

    def _drain(self) -> None:
        while (item := self._take_urgent()) is not None:
            endpoint, body = item
            self._post(endpoint, body)
            with self._lock:
                self._urgent_item = None
        # Once the queue has room again, say how much it lost: running totals,
        # sent straight (not queued), so this report cannot itself be dropped.
        if (totals := self._drops_unreported()) and not self._handed_off:
            self._post(contract.EVENT.endpoint, self._drops_report(totals))
            self._dropped_reported = totals
        while (batch := self._take_metric_batch()) is not None:
            self._post(METRICS, batch)
            with self._lock:
                self._metric_batch = None
            if not self._stop.is_set() and (
                    self._status_due or time.monotonic() >= self._next_heartbeat):
                return

    # -- at exit --------------------------------------------------------------------
    def _hand_off(self) -> int:
        """Everything still undelivered into one file where the control plane
        collects it; the thread, if still posting, stops taking items. An
        item in flight goes too: storing it twice is harmless (events carry
        their key; points and checkpoint reports are unique by content)."""
        with self._spool_lock, self._lock:
            if self._handed_off:
                return 0
            self._handed_off = True
            items = [self._urgent_item] if self._urgent_item else []
            items += self.urgent.take_all()
            if totals := {k: v for k, v in self.dropped.items() if v}:
                if totals != self._dropped_reported:
                    items.append((contract.EVENT.endpoint, self._drops_report(totals)))
                    self._dropped_reported = totals
            if self._metric_batch:
                items.append((METRICS, self._metric_batch))
            points = [body for _, body in self.metrics.take_all()]
        for queue in (self.urgent, self.metrics):
            queue.remove_folder()
        for point in points:
            if not isinstance(point["value"], float):
                point["value"] = float(point["value"].get())
        items += [(METRICS, self._batch(points[i:i + METRICS_PER_BATCH]))
                  for i in range(0, len(points), METRICS_PER_BATCH)]
        left = sum(len(body["points"]) if endpoint == METRICS else 1
                   for endpoint, body in items)
        if not items or self.handoff is None:
            return left
        key = spool.handoff_key(self.attempt_id, self.rank, self._tag)
        header = {"job_id": self.job_id, "attempt_id": self.attempt_id, "rank": self.rank}
        try:
            self.handoff(key, spool.handoff_bytes(header, items))
        except Exception as exc:  # any storage failure: say so, do not fail the exit
            log.warning("could not hand off %d undelivered reports to %s: %s", left, key, exc)
            return left
        self.handed_off_to = f"left at {key} for the control plane to collect"
        return left


def _resolve(point: dict) -> bool:
    """Turn a ready deferred value into a float in place; False if not ready."""
    value = point["value"]
    if isinstance(value, float):
        return True
    if not value.ready():
        return False
    point["value"] = float(value.get())
    return True


def from_env(env, rank: int, heartbeat_interval_s: float,
             gpu_stats=None) -> NullReporter:
    url, token = env.get(contract.URL), env.get(contract.TOKEN)
    if not url or not token:
        return NullReporter()
    checkpoint_uri = env.get(contract.CHECKPOINT_URI)
    return Reporter(url, token, env.get(contract.ATTEMPT_ID, "0"), rank,
                    env.get(contract.NODE, ""), heartbeat_interval_s, gpu_stats,
                    job_id=env.get(contract.JOB_ID, ""),
                    handoff=spool.storage_handoff(checkpoint_uri) if checkpoint_uri else None)


def report_once(env, rank: int, kind: str, message: str, data: dict) -> None:
    """Send one event from a reporter of its own, for exits before a run's
    reporter exists; a no-op without a control plane."""
    reporter = from_env(env, rank, 1.0)
    reporter.event(kind, message, data)
    reporter.start()
    reporter.close(timeout_s=3.0)
