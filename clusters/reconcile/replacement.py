"""Taking a bad node out of service and putting a spare in its place.

Used by the job reconciler (a node failed under a job) and the cluster
reconciler (an operator asked for a replacement). Every step writes a
NodeEvent through Node.transition; the provider is asked to retire the bad
node and bring up a new spare.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F

from clusters.models import Node, NodeEvent, NodeHealthEvent
from clusters.providers import get_provider, pool_info

log = logging.getLogger(__name__)


def cordon_with_evidence(node: Node, reason: str, evidence: dict, now, *,
                         health_kind: str | None = None, count_failure: bool = True) -> bool:
    """Cordon a node because of evidence; True if this call cordoned it."""
    if health_kind is not None:
        NodeHealthEvent.objects.create(
            node=node, kind=health_kind, severity=NodeHealthEvent.Severity.CRITICAL,
            message=reason[:500], evidence=evidence, created_at=now, handled_at=now,
        )
    node.refresh_from_db()
    if node.state not in (Node.State.READY, Node.State.PROVISIONING, Node.State.DRAINING):
        return False
    if node.cordon(reason, evidence=evidence, now=now) is None:
        return False
    if count_failure:
        Node.objects.filter(pk=node.pk).update(failure_count=F("failure_count") + 1)
    try:
        get_provider(node.cluster).cordon(pool_info(node.pool), node.name)
    except Exception as exc:  # the row is the truth; the provider catches up next pass
        log.warning("provider cordon of %s failed: %s", node.name, exc)
    return True


def promote_spare(pool, replaces: Node | None, now) -> Node | None:
    """Turn one ready spare of the pool into a working node."""
    with transaction.atomic():
        spare = (
            Node.objects.select_for_update(skip_locked=True)
            .filter(pool=pool, is_spare=True, state=Node.State.READY)
            .order_by("created_at", "id")
            .first()
        )
        if spare is None:
            return None
        Node.objects.filter(pk=spare.pk).update(
            is_spare=False, replaces=replaces, state_reason="promoted from the spare pool"
        )
        NodeEvent.objects.create(
            node=spare, from_state=spare.state, to_state=spare.state,
            reason=f"promoted from the spare pool to replace {replaces.name}" if replaces
            else "promoted from the spare pool",
            evidence={"replaces": replaces.name if replaces else None}, created_at=now,
        )
    spare.refresh_from_db()
    return spare


def retire(node: Node, reason: str, now) -> Node | None:
    """Ask the provider to replace the node; record it replaced and add the
    new machine the provider returned as a spare. Idempotent."""
    pool = node.pool
    node.refresh_from_db()
    if node.state in Node.RETIRED:
        return None
    if node.state == Node.State.READY:
        node.cordon(reason, now=now)
    info = get_provider(node.cluster).replace(pool_info(pool), node.name)
    node.transition(Node.State.REPLACED, reason=reason, now=now,
                    evidence={"new": info.name if info else None}, replace_requested_at=None)
    if info is None:
        return None
    new, created = Node.objects.get_or_create(
        cluster=node.cluster, name=info.name,
        defaults={
            "pool": pool, "provider_id": info.provider_id, "address": info.address,
            "gpus": info.gpus, "is_spare": True, "labels": info.labels,
            "state": Node.State.PROVISIONING, "created_at": now,
        },
    )
    if created:
        NodeEvent.objects.create(node=new, from_state="", to_state=Node.State.PROVISIONING,
                                 reason=f"provisioned to replace {node.name}", created_at=now)
        if info.ready:
            new.transition(Node.State.READY, reason="provider reports it ready", now=now)
    return new


def replace_node(node: Node, reason: str, now) -> tuple[Node | None, Node | None]:
    """Promote a spare in place of `node`, then retire `node`.

    Returns (the promoted spare or None, the provider's new spare or None)."""
    spare = promote_spare(node.pool, node, now)
    new_spare = retire(node, reason, now)
    return spare, new_spare
