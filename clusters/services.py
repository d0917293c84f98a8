"""Operator actions on nodes. Each goes through the Node transition methods
(so it records a NodeEvent and refuses an illegal move with 409), then asks
the cluster reconciler to look now rather than at its next sweep."""

from django.db import transaction
from django.utils import timezone

from controlplane.lib.errors import IllegalTransition, PermanentError
from controlplane.lib.tasks import RECONCILE_CLUSTER

from .models import Cluster, Node, NodeEvent
from .providers import get_provider, pool_info


def _actor(user) -> str:
    return f"user:{user.get_username()}"


def _reason(verb: str, user, reason: str) -> str:
    text = f"{verb} by {user.get_username()}"
    return f"{text}: {reason}" if reason else text


def cordon(node: Node, user, reason: str = "") -> NodeEvent | None:
    with transaction.atomic():
        event = node.cordon(_reason("cordoned", user, reason), actor=_actor(user))
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def uncordon(node: Node, user, reason: str = "") -> NodeEvent | None:
    with transaction.atomic():
        event = node.uncordon(_reason("uncordoned", user, reason), actor=_actor(user))
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def drain(node: Node, user, reason: str = "") -> NodeEvent | None:
    with transaction.atomic():
        event = node.drain(_reason("drain asked", user, reason), actor=_actor(user))
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def request_replacement(node: Node, user, reason: str = "", now=None) -> NodeEvent | None:
    """Mark the node for replacement; the cluster reconciler carries it out.
    Idempotent: a second request writes nothing and returns None."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = Node.objects.filter(pk=node.pk, replace_requested_at__isnull=True).exclude(
            state__in=Node.RETIRED
        ).update(replace_requested_at=now)
        node.refresh_from_db()
        if not changed:
            if node.state in Node.RETIRED:
                raise IllegalTransition("node", node.name, node.state, "replace")
            return None
        event = NodeEvent.objects.create(
            node=node, from_state=node.state, to_state=node.state, actor=_actor(user),
            reason=_reason("replacement requested", user, reason)[:300], created_at=now,
        )
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def inject_fault(node: Node, kind: str) -> dict:
    """Local clusters only: make a node misbehave on purpose (tests, demos)."""
    cluster = node.cluster
    if cluster.provider != Cluster.Provider.LOCAL:
        raise PermanentError(
            f"fault injection needs a local cluster; {cluster.name} is {cluster.provider}"
        )
    result = get_provider(cluster).inject_fault(pool_info(node.pool), node.name, kind)
    RECONCILE_CLUSTER.soon(cluster.pk)
    return result or {}
