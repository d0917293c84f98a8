"""A node's return to service: every pool only shrinks without it.

A return starts when an operator asks (the API's `return`, the node page's
button) or when the node's owner mended and resumed it at the provider
(follow.py: seen held or down there since it left service, available
again now). The cluster pass then, one node at a time:

1. lifts Regatta's own hold at the provider (Slurm's drain, a Kubernetes
   cordon: `uncordon`), which an owner's resume may have done already;
2. checks the node: the provider must report it ready with no admin hold,
   and it must pass the cluster's preflight as a joining spare does;
3. puts it back, ready (a spare when its slot was filled while it was
   out: Node.transition keeps the pool at its size), or, if the check
   fails, keeps it out with the evidence and held at the provider again,
   for its owner to mend and resume once more.
"""

from __future__ import annotations

import logging

from clusters.models import Node, NodeEvent, NodeHealthEvent
from clusters.providers import Placement, pool_info
from controlplane.lib import locks
from controlplane.lib.errors import PermanentError, TemporaryError
from controlplane.lib.tasks import RECONCILE_CLUSTER

from .replacement import cordon_at_provider

log = logging.getLogger(__name__)

RETURNABLE = Node.RETURNABLE


def request_return(node: Node, *, actor: str, reason: str, now) -> NodeEvent | None:
    """Node.request_return, and the cluster's pass asked for soon."""
    event = node.request_return(actor=actor, reason=reason, now=now)
    if event is not None:
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def check_one_return(cluster, pools, provider, now) -> Node | None:
    """Carry out the oldest return asked in `pools`; the node acted on, or
    None (none asked, or the provider cannot be asked now)."""
    node = (Node.objects.filter(pool__in=pools, return_requested_at__isnull=False)
            .select_related("pool__cluster").order_by("return_requested_at", "id").first())
    if node is None:
        return None
    if node.state not in RETURNABLE:
        _settle(node)
        return node
    info = pool_info(node.pool)
    try:
        provider.uncordon(info, node.name)
        seen = {n.name: n for n in provider.list_nodes(info)}.get(node.name)
    except PermanentError as exc:
        _refuse(node, f"the provider cannot return it: {exc}", {}, now, hold=False)
        return node
    except TemporaryError as exc:
        log.warning("cluster %s: return of %s waits: %s", cluster.name, node.name, exc)
        return None
    cfg = cluster.config
    if seen is not None and not seen.ready and not seen.admin_hold and (
            now - node.return_requested_at).total_seconds() < cfg.return_settle_s:
        # Lifting a hold can leave the node not ready for a moment (Slurm
        # waits to hear from a resumed node's slurmd): asked again next pass.
        return node
    if seen is None or not seen.ready or seen.admin_hold:
        why = ("the provider no longer lists it" if seen is None
               else f"held at the provider: {seen.admin_hold}" if seen.admin_hold
               else "the provider does not report it ready")
        _refuse(node, why, {"provider_status": seen.conditions if seen else None}, now,
                hold=seen is not None)
        return node
    if cfg.preflight_on:
        placement = Placement(node=node.name, node_rank=0, provider_id=node.provider_id,
                              address=node.address)
        try:
            result = provider.preflight(info, (placement,), timeout_s=cfg.preflight_timeout_s)
        except (PermanentError, TemporaryError) as exc:
            log.warning("cluster %s: return check of %s not run: %s", cluster.name,
                        node.name, exc)
            return None
        if result.pending:
            return None  # the check runs beside the pass; a later pass reads it
        # The check may have taken a while: act on it only if the cluster is still ours.
        locks.ensure_held()
        evidence = {"preflight": result.node_check(node.name), "message": result.message}
        if not result.ok:
            _refuse(node, f"failed its health check: {result.message}", evidence, now,
                    hold=True, health=True)
            return node
    else:
        evidence = {"check": "the provider reports it ready (preflight is off)"}
    _put_back(node, evidence, now, checked=cfg.preflight_on)
    return node


def _put_back(node: Node, evidence: dict, now, *, checked: bool) -> None:
    actor = node.return_requested_by or "reconciler"
    fields = {"preflight_passed_at": now} if checked else {}
    # What the node was taken out for is answered by the check it passed:
    # an old open event must not fail the first job placed on it.
    NodeHealthEvent.objects.filter(node=node, handled_at__isnull=True).update(handled_at=now)
    node.transition(Node.State.READY, reason="returned to service: its health check passed",
                    actor=actor, now=now, evidence={**evidence, "was": node.state},
                    provider_held=False, return_requested_at=None, return_requested_by="",
                    replace_requested_at=None, not_ready_since=None, **fields)
    RECONCILE_CLUSTER.soon(node.cluster_id)


def _refuse(node: Node, why: str, evidence: dict, now, *, hold: bool,
            health: bool = False) -> None:
    """The node stays out, saying why; held at the provider again, so that
    its owner's next resume is seen as the next mend."""
    if health:
        NodeHealthEvent.objects.create(
            node=node, kind=NodeHealthEvent.Kind.NCCL_TEST,
            severity=NodeHealthEvent.Severity.CRITICAL, message=f"return check: {why}"[:500],
            evidence=evidence, created_at=now, handled_at=now)
    _settle(node)
    node.note(f"not returned to service: {why}", now=now, evidence=evidence)
    if hold:
        cordon_at_provider(node)


def _settle(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(return_requested_at=None, return_requested_by="",
                                           provider_held=False)
