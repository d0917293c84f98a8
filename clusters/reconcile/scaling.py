"""What became of a pool's asks for capacity, read back from the provider.

A replacement (terminate through the Auto Scaling group, desired capacity
kept) and a spare (desired capacity + 1) are asks the provider answers
later, if at all: the group's launch may fail, e.g. `InsufficientInstanceCapacity`
for a p5, and keep failing. Nothing waits for the answer. An ask starts a
watch on the pool (`NodePool.scaling_watch_since`); each cluster pass then
reads the provider's account of it (`scaling_status`, the group's scaling
activities) until the group settles. A failed or cancelled activity becomes
an event on the node whose successor it was (a NodeEvent with AWS's message),
is counted on the pool, and shown as the cluster's `ScalingFailed` condition
and on the fleet page; no further ask is made to that pool until a backoff
(doubling per failure in a row, the longest at once for a failure asking
again cannot fix) has passed. A settled group ends the watch and the count.

A retired machine may be held by the group's termination lifecycle hook
(`Terminating:Wait`) until the hook times out. Once nothing of ours runs on
the node, `release_retired` tells the provider to let it go; only nodes whose
machine this control plane retired are ever released.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import F

from clusters.models import Node, NodeEvent, NodePool
from clusters.providers.base import ScalingStatus
from clusters.providers.capabilities import TracksScaling
from controlplane.lib.errors import PermanentError, TemporaryError

from ..workload import jobs_on

log = logging.getLogger(__name__)

BACKOFF_S = 30.0
BACKOFF_MAX_S = 1800.0
CONDITION = "ScalingFailed"
# Activity ids remembered per pool so a failure read twice is recorded once.
SEEN_KEPT = 50


def note_asked(pool: NodePool, now) -> None:
    """An ask for capacity was made: watch the provider's account of it
    (from the first ask the watch does not cover yet)."""
    NodePool.objects.filter(pk=pool.pk, scaling_watch_since__isnull=True).update(
        scaling_watch_since=now)


def backoff_left(pool: NodePool, now) -> float:
    """Seconds before the pool may be asked for capacity again (0: now)."""
    pool.refresh_from_db(fields=["scaling_failures", "scaling_failed_at", "scaling_permanent"])
    if not pool.scaling_failures or pool.scaling_failed_at is None:
        return 0.0
    delay = BACKOFF_MAX_S if pool.scaling_permanent else min(
        BACKOFF_MAX_S, BACKOFF_S * 2 ** (pool.scaling_failures - 1))
    return max(0.0, (pool.scaling_failed_at + timedelta(seconds=delay) - now).total_seconds())


def check_backoff(pool: NodePool, now) -> None:
    """Raise TemporaryError (with the delay left) while the pool backs off."""
    left = backoff_left(pool, now)
    if left > 0:
        raise TemporaryError(
            f"pool {pool.name}: capacity not asked for {left:.0f} s after "
            f"{pool.scaling_failures} failed launch(es): {pool.scaling_error}", delay=left)


def watch_scaling(pool: NodePool, provider, info, now) -> None:
    """Read how the pool's asks went; record failures; end a settled watch.
    A provider without a node source of its own (no TracksScaling) has its
    capacity at once: settled."""
    pool.refresh_from_db()
    since = pool.scaling_watch_since
    if since is None:
        return
    try:
        status = (provider.scaling_status(info, since)
                  if isinstance(provider, TracksScaling) else ScalingStatus())
    except (PermanentError, TemporaryError) as exc:
        # Read again next pass; the rest of the pass must not wait on it.
        log.warning("pool %s: scaling activities not read: %s", pool, exc)
        return
    seen = list(pool.scaling_seen or [])
    new = [f for f in status.failures if f.activity_id not in seen]
    if new:
        _record_failures(pool, new, seen, now)
    if status.settled:
        # The group holds what it was asked for: the failures in a row end.
        NodePool.objects.filter(pk=pool.pk, scaling_watch_since=since).update(
            scaling_watch_since=None, scaling_failures=0, scaling_failed_at=None,
            scaling_error="", scaling_permanent=False)


def _record_failures(pool: NodePool, new: list, seen: list, now) -> None:
    last = new[-1]
    NodePool.objects.filter(pk=pool.pk).update(
        scaling_failures=F("scaling_failures") + len(new), scaling_failed_at=now,
        scaling_error=f"{last.status}: {last.message}"[:2000],
        scaling_permanent=any(f.permanent for f in new),
        scaling_seen=(seen + [f.activity_id for f in new])[-SEEN_KEPT:])
    # The nodes retired since the watch began are the ones left without a
    # successor; without any (a spare was asked for), the condition says it.
    retired = Node.objects.filter(pool=pool, state=Node.State.REPLACED,
                                  replace_asked_at__gte=pool.scaling_watch_since)
    events = []
    for node in retired:
        for failure in new:
            events.append(NodeEvent(
                node=node, from_state=node.state, to_state=node.state,
                reason=f"the group could not launch a successor: {failure.status}: "
                       f"{failure.message}"[:300],
                evidence={"activity_id": failure.activity_id, "status": failure.status,
                          "message": failure.message[:2000],
                          "description": failure.description[:2000],
                          "started_at": failure.started_at, "permanent": failure.permanent},
                created_at=now))
    NodeEvent.objects.bulk_create(events)
    log.warning("pool %s: %d failed scaling activit(ies): %s", pool, len(new), last.message)


def conditions(cluster, now) -> list[dict]:
    """The cluster's `ScalingFailed` conditions, one per pool in failure."""
    out = []
    for pool in NodePool.objects.filter(cluster=cluster, scaling_failures__gt=0).order_by("name"):
        out.append({"type": CONDITION, "pool": pool.name, "status": "True",
                    "count": pool.scaling_failures, "message": pool.scaling_error[:1000],
                    "permanent": pool.scaling_permanent,
                    "at": pool.scaling_failed_at.isoformat() if pool.scaling_failed_at else None,
                    "retry_after_s": round(backoff_left(pool, now), 1)})
    return out


def release_retired(pool: NodePool, provider, info, now) -> None:
    """Let the machines of this pool's retired, drained nodes go: the ones
    whose retirement this control plane asked of the provider and that no
    gang holds any more. Without a node source of its own (no TracksScaling)
    a retired node holds nothing: released at once."""
    owed = list(Node.objects.filter(pool=pool, state=Node.State.REPLACED,
                                    replace_requested_at__isnull=True,
                                    replace_asked_at__isnull=False, released_at__isnull=True))
    if not owed:
        return
    busy = jobs_on(n.id for n in owed)
    for node in owed:
        if busy.get(node.id):
            continue  # its gang is still leaving: the drain is not done
        try:
            done = (provider.release(info, node.name, node.provider_id)
                    if isinstance(provider, TracksScaling) else "")
        except (PermanentError, TemporaryError) as exc:
            log.warning("node %s: machine not released: %s", node.name, exc)
            continue
        if done is None:
            continue  # not at its hook yet: a later pass
        if Node.objects.filter(pk=node.pk, released_at__isnull=True).update(
                released_at=now) and done:
            NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                                     reason=f"drained: {done}"[:300], created_at=now)
