"""Operator actions on nodes. Each goes through the Node transition methods
(so it records a NodeEvent and refuses an illegal move with 409), then asks
the cluster reconciler to look now rather than at its next sweep."""

from django.db import transaction
from django.utils import timezone

from controlplane.lib.errors import IllegalTransition, PermanentError, Refused
from controlplane.lib.tasks import RECONCILE_CLUSTER

from .models import Node, NodeEvent
from .providers import get_provider, pool_info
from .providers.capabilities import InjectsFaults
from .providers.registry import provider_class


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


def return_to_service(node: Node, user, reason: str = "", now=None) -> NodeEvent | None:
    """Put a mended node back: the cluster reconcile lifts Regatta's hold at
    the provider, checks the node, and returns it to service only if the
    check passes (clusters/reconcile/returns.py). Idempotent: asking again
    while a return is under way writes nothing and returns None."""
    now = now or timezone.now()
    node.refresh_from_db()
    if node.admin_hold:
        raise Refused(f"{node.name} is held by the scheduler's admin ({node.admin_hold}): "
                      "lift that hold there, and Regatta brings the node back")
    if node.state not in Node.RETURNABLE:
        raise IllegalTransition("node", node.name, node.state, "return to service")
    if node.return_requested_at is not None:
        return None
    with transaction.atomic():
        event = node.request_return(actor=_actor(user), now=now,
                                    reason=_reason("asked", user, reason))
        RECONCILE_CLUSTER.soon(node.cluster_id)
    return event


def inject_fault(node: Node, kind: str) -> dict:
    """Make a node misbehave on purpose (tests, demos), where the cluster's
    provider can (InjectsFaults: the local one)."""
    cluster = node.cluster
    if not issubclass(provider_class(cluster.provider), InjectsFaults):
        raise PermanentError(
            f"fault injection needs a local cluster; {cluster.name} is {cluster.provider}"
        )
    result = get_provider(cluster).inject_fault(pool_info(node.pool), node.name, kind)
    RECONCILE_CLUSTER.soon(cluster.pk)
    return result or {}
