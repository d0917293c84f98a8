"""Cluster reconcile: nodes, spares, drains, replacements, health signals,
then a preflight check of one spare that joined (spares.py). When the pass
changed the capacity jobs can use, it asks for an admission pass (a task of
the jobs app, sent by name: clusters never import jobs).
Level-triggered and idempotent, like the job reconciler."""

from __future__ import annotations

import logging

from django.db.models import Q
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent
from clusters.providers import get_provider, pool_info
from clusters.providers.capabilities import ReportsHealth
from controlplane.lib import runner
from controlplane.lib.errors import PermanentError, TemporaryError
from controlplane.lib.reconcile import Result
from controlplane.lib.tasks import ADMIT_CLUSTER

from .. import wake
from ..workload import jobs_on_node
from . import late_logs
from .nodes import account_ready_time, hold_spares, keep_spares, send_drain, sync_pool
from .promotion import fill_vacancies
from .replacement import ask_owed_replacements, replace_node, take_out
from .returns import check_one_return
from .scaling import CONDITION as SCALING_CONDITION
from .scaling import conditions as scaling_conditions
from .scaling import release_retired, watch_scaling
from .spares import check_one_spare

log = logging.getLogger(__name__)
# (cluster, pool, message) already warned of in this process.
_SPARES_NOT_PROVISIONED: set[tuple] = set()

__all__ = ["CLUSTERS", "due_cluster_ids", "reconcile_cluster_unlocked", "reconcile_cluster_locked"]


def due_cluster_ids(now) -> list[int]:
    return list(
        Cluster.objects.filter(Q(next_reconcile_at__isnull=True) | Q(next_reconcile_at__lte=now))
        .order_by("id").values_list("id", flat=True)
    )


def reconcile_cluster_locked(cluster_id: int, now=None) -> Result | None:
    """The entry point tasks call: the one reconcile runner (a pass at a time
    per cluster, error classes). Returns None when another worker holds the
    cluster (it will store the next look)."""
    return runner.run(CLUSTERS, cluster_id, now or timezone.now())


def reconcile_cluster_unlocked(cluster_id: int, now=None) -> Result:
    """One pass, with no lock and no error classes: the step the runner
    takes inside `reconcile_cluster_locked`, which is what tasks call. Its errors are
    raised as they are; tests call it to drive a pass at a chosen `now`."""
    now = now or timezone.now()
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return Result.done("no such cluster")
    provider = get_provider(cluster)
    pools = list(cluster.pools.all())
    capacity = _capacity(cluster)
    for pool in pools:
        info = pool_info(pool)
        sync_pool(pool, provider, info, now)
        # A provider without signals (Slurm: a down node is listed not ready) has none.
        _record_health(pool, provider.health_signals(info)
                       if isinstance(provider, ReportsHealth) else [], now)
        _take_out_idle_with_open_events(pool, now)
        _close_events_of_retired_nodes(pool, now)
        _carry_out_drains(pool, provider, info, now)
        # How earlier asks for capacity went, before asking more.
        watch_scaling(pool, provider, info, now)
        # Jobs' passes claim replacements; the provider is asked here.
        ask_owed_replacements(pool, now)
        release_retired(pool, provider, info, now)
        # The safety net: a slot left by a node taken out anywhere (an
        # operator's cordon, a provider's report) is filled here.
        fill_vacancies(pool, now)
        try:
            keep_spares(pool, provider, info, now)
        except (PermanentError, TemporaryError) as exc:
            # A pool that cannot grow now must not stop admission on the rest.
            # Said once per pool and reason: a pool with no way to add nodes
            # (no asg_name, no Karpenter) would otherwise warn every pass.
            said = (cluster.id, pool.id, str(exc))
            (log.debug if said in _SPARES_NOT_PROVISIONED else log.warning)(
                "cluster %s pool %s: spares not provisioned: %s", cluster.name, pool.name, exc)
            _SPARES_NOT_PROVISIONED.add(said)
        hold_spares(pool, provider, info)
    account_ready_time(cluster, now)
    late_logs.collect(cluster, provider, now)
    if _capacity(cluster) != capacity:
        ADMIT_CLUSTER.soon(cluster.id)
    # Last: admission must not wait for a node's check. A node coming back
    # to service first: it is capacity the pool lacks, a spare is not.
    check_one_return(cluster, pools, provider, now)
    check_one_spare(cluster, pools, provider, now)
    interval = cluster.config.reconcile_interval
    Cluster.objects.filter(pk=cluster.pk).update(
        last_reconciled_at=now, next_reconcile_at=now + timezone.timedelta(seconds=interval),
        # A pass that got this far succeeded: an error an earlier one met is
        # over. The pools' failed launches are as this pass found them.
        conditions=[c for c in cluster.conditions
                    if c.get("type") not in (ERROR_CONDITION, SCALING_CONDITION)]
        + scaling_conditions(cluster, now),
        last_error="",
    )
    return Result.after(interval)


ERROR_CONDITION = "ReconcileError"


class _Clusters:
    """Clusters as the reconcile runner sees them (controlplane/lib/runner.py)."""

    name = "cluster"
    # Every sweep asks for each cluster: an ask that finds a pass running is
    # the next sweep's to make, not one more pass straight after it.
    keeps_asks = False

    def reconcile(self, cluster_id: int, now) -> Result:
        return reconcile_cluster_unlocked(cluster_id, now)

    def errors_in_a_row(self, cluster_id: int) -> int:
        rows = Cluster.objects.filter(pk=cluster_id).values_list("conditions", flat=True)
        found = next((c for c in rows.first() or [] if c.get("type") == ERROR_CONDITION), None)
        return int(found["count"]) if found else 0

    def record_error(self, cluster_id: int, now, error: runner.ReconcileError) -> None:
        cluster = Cluster.objects.filter(pk=cluster_id).first()
        if cluster is None:
            return
        conditions = [c for c in cluster.conditions if c.get("type") != ERROR_CONDITION]
        conditions.append({"type": ERROR_CONDITION, **error.as_condition(now)})
        Cluster.objects.filter(pk=cluster_id).update(
            conditions=conditions, last_error=error.message[:5000],
            next_reconcile_at=now + timezone.timedelta(seconds=error.retry_after))

    def clear_error(self, cluster_id: int) -> None:
        pass  # reconcile_cluster_unlocked's own last write drops the condition


CLUSTERS = _Clusters()


def _capacity(cluster) -> set[tuple[int, int]]:
    """The working nodes jobs may be placed on, with their pools."""
    return set(Node.objects.filter(cluster=cluster, state=Node.State.READY, is_spare=False)
               .values_list("id", "pool_id"))


def _record_health(pool, signals, now) -> None:
    spells = _new_spells(pool, signals, now)
    if not signals:
        return
    nodes = {n.name: n for n in Node.objects.filter(pool=pool, name__in={s.node for s in signals})}
    for signal in signals:
        node = nodes.get(signal.node)
        if node is None:
            continue
        key = signal.key or f"{signal.node}:{signal.kind}:{signal.message}"
        if signal.continuous:
            if (node.id, key) not in spells:
                continue  # the same spell as the last pass saw
            # Each spell is an event of its own: a node that shows the same
            # condition a second time, after it cleared, fails again.
            key = f"{key}@{now.isoformat()}"
        if NodeHealthEvent.objects.filter(node=node, evidence__key=key).exists():
            continue
        event = NodeHealthEvent.objects.create(
            node=node, kind=signal.kind, severity=signal.severity, message=signal.message[:500],
            evidence={**signal.evidence, "key": key}, created_at=now,
        )
        # A spot notice needs acting on whatever severity the provider gives it.
        actionable = (signal.severity == NodeHealthEvent.Severity.CRITICAL
                      or signal.kind == NodeHealthEvent.Kind.SPOT_NOTICE)
        if not actionable:
            NodeHealthEvent.objects.filter(pk=event.pk).update(handled_at=now)
            continue
        if wake.jobs_on(node.id):
            continue  # the jobs handle it: checkpoint, stop, replace
        # Nothing runs there: take the node out now.
        evidence = {"health_event": event.id, "kind": signal.kind, **signal.evidence}
        if signal.kind == NodeHealthEvent.Kind.SPOT_NOTICE:
            replace_node(node, f"spot interruption notice: {signal.message}", now)
        else:
            # A failing node leaves service with its evidence, and a spare
            # takes its place, as it would under a job.
            take_out(node, f"{signal.kind}: {signal.message}", evidence, now,
                     replace_reason=f"replaced after {signal.kind}: {signal.message}"[:300])
        NodeHealthEvent.objects.filter(pk=event.pk).update(handled_at=now)


def _new_spells(pool, signals, now) -> set[tuple[int, str]]:
    """The continuous signals (HealthSignal.continuous) that began since the
    last pass, as (node id, key); each node's set of live ones is kept on
    its row, written only where it changed."""
    live: dict[str, set[str]] = {}
    for signal in signals:
        if signal.continuous:
            live.setdefault(signal.node, set()).add(signal.key)
    rows = Node.objects.filter(pool=pool).filter(
        Q(name__in=list(live)) | ~Q(active_signals=[])).only("id", "name", "active_signals")
    began = set()
    for row in rows:
        now_live = live.get(row.name, set())
        before = set(row.active_signals or ())
        began |= {(row.id, key) for key in now_live - before}
        if now_live != before:
            Node.objects.filter(pk=row.pk).update(active_signals=sorted(now_live))
    return began


def _take_out_idle_with_open_events(pool, now) -> None:
    """A critical event left open on a node in service was left for the job
    that ran there (`_record_health`); once no job runs there any more (its
    attempt ended for another cause first), the node leaves service for it
    here, as an idle node would have at once, rather than failing the next
    job placed on it."""
    open_events = NodeHealthEvent.objects.filter(
        node__pool=pool, node__state=Node.State.READY, handled_at__isnull=True,
        severity=NodeHealthEvent.Severity.CRITICAL,
    ).exclude(kind=NodeHealthEvent.Kind.SPOT_NOTICE).select_related("node").order_by("id")
    for event in open_events:
        node = event.node
        if jobs_on_node(node.id):
            continue
        take_out(node, f"{event.kind}: {event.message}"[:300],
                 {"health_event": event.id, "kind": event.kind}, now,
                 replace_reason=f"replaced after {event.kind}: {event.message}"[:300])
        NodeHealthEvent.objects.filter(node=node, handled_at__isnull=True).update(handled_at=now)


def _close_events_of_retired_nodes(pool, now) -> None:
    """An event recorded while a job's reconcile was already taking its node
    out (the job saw the ranks die first) has nothing left to act on once the
    node is retired: the recovery it asked for is done."""
    NodeHealthEvent.objects.filter(
        node__pool=pool, node__state__in=Node.RETIRED, handled_at__isnull=True
    ).update(handled_at=now)


def _carry_out_drains(pool, provider, info, now) -> None:
    asked = Node.objects.filter(pool=pool).exclude(state__in=Node.RETIRED).filter(
        Q(replace_requested_at__isnull=False) | Q(state=Node.State.DRAINING)
    )
    for node in asked:
        job_ids = jobs_on_node(node.id)
        if not job_ids:
            if node.replace_requested_at is not None:
                replace_node(node, "replacement asked by an operator", now)
            elif node.state == Node.State.DRAINING:
                node.transition(Node.State.CORDONED, reason="drained: nothing runs on it",
                                now=now)
            continue
        if node.state in (Node.State.READY, Node.State.CORDONED):
            node.drain("draining for a replacement asked by an operator", now=now)
        send_drain(node, provider, info, now)
        wake.jobs(job_ids)
