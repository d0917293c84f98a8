"""Taking a bad node out of service and putting a spare in its place.

Used by the job reconciler (a node failed under a job) and the cluster
reconciler (an operator asked for a replacement, a failing or noticed idle
node). Every step writes a NodeEvent through Node.transition.

A replacement has two halves. The claim is quick and local: one
transaction, holding the pool's and the node's rows, moves it to `replaced`
and fills its slot from the spares (promotion.py, the one place that
promotes), so a job can relaunch on that spare at once; a pass that finds
the node claimed already promotes nothing. The provider's half (retire
the machine, bring up a new spare) may block for minutes (AWS waits for the
group's new instance), so it never runs on a job's reconcile: the claim
leaves `replace_requested_at` set (the ask is owed) and the cluster
reconcile asks (`ask_owed_replacements`), again with backoff after a
failure, and again after a lease when the pass that asked died.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F

from clusters.models import Node, NodeEvent, NodeHealthEvent, NodePool
from clusters.providers import get_provider, pool_info
from controlplane.lib.errors import IllegalTransition
from controlplane.lib.tasks import RECONCILE_CLUSTER

from .promotion import fill_vacancies
from .scaling import backoff_left, note_asked

log = logging.getLogger(__name__)

# A provider call running longer than this is taken for dead, and the
# replacement asked again (a call is a few requests: it never waits).
REPLACE_LEASE_S = 600.0
ASKED = "replacement asked of the provider"


def cordon_with_evidence(node: Node, reason: str, evidence: dict, now, *,
                         health_kind: str | None = None, count_failure: bool = True) -> bool:
    """Cordon a node because of evidence; True if this call cordoned it.

    A node the provider already reported failed is cordoned too, so the
    evidence is on its timeline and the failure it showed is counted once
    (the report counted it)."""
    cordoned = _cordon_row(node, reason, evidence, now, health_kind, count_failure)
    if cordoned:
        cordon_at_provider(node)
    return cordoned


@dataclass(frozen=True)
class TakenOut:
    cordoned: bool  # this call cordoned it (else something took it out before)
    spare: Node | None  # the spare promoted in its place (or the one a first claim promoted)
    provisioned: Node | None  # the provider's new machine, joining as a spare


def take_out(node: Node, reason: str, evidence: dict, now, *, replace_reason: str,
             health_kind: str | None = None, count_failure: bool = True,
             ask_provider: bool = True) -> TakenOut:
    """Cordon a bad node with its evidence and replace it from the spares.

    The cordon and the claim are one transaction: between two, a cluster pass
    would find the pool a working node short and promote a spare of its own,
    and the claim would promote a second one (a pool over its size, and a
    replaced node with no successor). A job's pass leaves the provider's half
    to the cluster reconcile (`ask_provider=False`)."""
    with transaction.atomic():
        NodePool.hold(node.pool_id)
        cordoned = _cordon_row(node, reason, evidence, now, health_kind, count_failure)
        claimed = _claim(node, replace_reason, now)
    if cordoned:
        cordon_at_provider(node)
    spare = successor_of(node)
    if not claimed:
        return TakenOut(cordoned, spare, None)
    if not ask_provider:
        RECONCILE_CLUSTER.soon(node.cluster_id)  # the cluster reconcile asks the provider soon
        return TakenOut(cordoned, spare, None)
    return TakenOut(cordoned, spare, _ask_now_or_later(node, replace_reason, now))


def _cordon_row(node: Node, reason: str, evidence: dict, now, health_kind: str | None,
                count_failure: bool) -> bool:
    if health_kind is not None:
        NodeHealthEvent.objects.create(
            node=node, kind=health_kind, severity=NodeHealthEvent.Severity.CRITICAL,
            message=reason[:500], evidence=evidence, created_at=now, handled_at=now,
        )
    node.refresh_from_db()
    was = node.state
    if was not in (Node.State.READY, Node.State.PROVISIONING, Node.State.DRAINING,
                   Node.State.FAILED):
        return False
    try:
        if node.cordon(reason, evidence=evidence, now=now) is None:
            return False
    except IllegalTransition:  # another pass retired it in between
        return False
    if count_failure and was != Node.State.FAILED:
        Node.objects.filter(pk=node.pk).update(failure_count=F("failure_count") + 1)
    return True


def cordon_at_provider(node: Node) -> None:
    try:
        get_provider(node.cluster).cordon(pool_info(node.pool), node.name)
    except Exception as exc:  # the row is the truth; the provider catches up next pass
        log.warning("provider cordon of %s failed: %s", node.name, exc)
        return
    # Held there by Regatta itself: the node turning available at the
    # provider from now on is its owner resuming it (follow.py).
    Node.objects.filter(pk=node.pk).update(provider_held=True)


def _claim(node: Node, reason: str, now) -> bool:
    """Whether this pass claimed the node. Its slot is filled in the same
    transaction (promotion.py decides whether a spare is owed: none for a
    spare, none for a node whose slot a cluster pass filled already)."""
    with transaction.atomic():
        NodePool.hold(node.pool_id)  # before the node's row: the one lock order
        # The row lock makes a concurrent claim wait for this one and then see
        # the node replaced (SQLite's IMMEDIATE transactions serialise the same way).
        row = Node.objects.select_for_update().filter(pk=node.pk).first()
        if row is None or row.state in Node.RETIRED:
            return False
        if row.state in (Node.State.READY, Node.State.PROVISIONING):
            row.cordon(reason, now=now)
        row.transition(Node.State.REPLACED, reason=reason, now=now, replace_requested_at=now,
                       replace_asked_at=None)
        fill_vacancies(row.pool, now, first=row)
    node.refresh_from_db()
    return True


def successor_of(node: Node) -> Node | None:
    """The spare promoted into the node's slot since it left service."""
    node.refresh_from_db(fields=["successor"])
    return node.successor


def _ask_now_or_later(node: Node, reason: str, now) -> Node | None:
    """Ask at once, unless the pool backs off after failed launches: then
    the ask stays owed (`replace_requested_at`) for `ask_owed_replacements`,
    rather than take one more machine away with no successor coming."""
    left = backoff_left(node.pool, now)
    if left <= 0:
        return _ask_provider(node, reason, now)
    NodeEvent.objects.create(
        node=node, from_state=node.state, to_state=node.state,
        reason=f"replacement deferred {left:.0f} s: the pool's launches fail"[:300],
        evidence={"error": node.pool.scaling_error[:1000]}, created_at=now)
    return None


def _ask_provider(node: Node, reason: str, now) -> Node | None:
    """The claimed node's provider call; the new machine it returns joins as a spare."""
    pool = node.pool
    asked_at = node.replace_requested_at
    Node.objects.filter(pk=node.pk).update(replace_asked_at=now)
    NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                             reason=ASKED, evidence={"reason": reason[:300]}, created_at=now)
    try:
        info = get_provider(node.cluster).replace(pool_info(pool), node.name)
    except Exception as exc:  # asked again with backoff; the spare already took its place
        log.warning("provider replace of %s failed: %s", node.name, exc)
        Node.objects.filter(pk=node.pk).update(replace_error=str(exc)[:2000],
                                               replace_failed_at=now,
                                               replace_failures=F("replace_failures") + 1)
        NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                                 reason=f"the provider's replacement failed: {exc}"[:300],
                                 evidence={"error": str(exc)[:1000]}, created_at=now)
        return None
    # Only the ask this pass made is settled: a later one keeps its own mark.
    # The machine is the provider's to retire or to keep drained (Slurm):
    # held either way, so its turning available later is a mend.
    Node.objects.filter(pk=node.pk, replace_requested_at=asked_at).update(
        replace_requested_at=None, replace_error="", replace_failed_at=None,
        replace_failures=0, provider_held=True)
    note_asked(pool, now)
    NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                             # Said apart from the spare promoted into its place
                             # (`replaced_by`): this machine joins the spares.
                             reason=f"the provider made a new machine for it: {info.name}, "
                                    "a spare" if info
                             else "the provider took it back; the new machine comes later",
                             evidence={"new": info.name if info else None}, created_at=now)
    if info is None:
        return None
    with transaction.atomic():
        # A node joining takes the pool's lock first, as the cluster pass
        # recording the same machine does: without it, this insert's foreign
        # key check on the pool, at commit, waited on that pass's pool lock
        # while the pass's insert of the same name waited on this one.
        NodePool.hold(pool.pk)
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
                                     reason=f"provisioned to replace {node.name}",
                                     created_at=now)
            if info.ready:
                new.transition(Node.State.READY, reason="provider reports it ready", now=now)
    return new


def replace_node(node: Node, reason: str, now) -> tuple[Node | None, Node | None]:
    """Claim `node`, promote a spare in its place, and ask the provider to
    replace the machine: the cluster reconcile's way. Idempotent, also under
    concurrent passes: a pass that finds the node claimed calls nothing and
    promotes nothing.

    Returns (the spare in the node's place or None, the provider's new spare
    or None)."""
    if not _claim(node, reason, now):
        return successor_of(node), None
    return successor_of(node), _ask_now_or_later(node, reason, now)


# After the provider failed a replacement, it is asked again after this long,
# doubling per failure in a row up to the cap.
ASK_BACKOFF_S = 30.0
ASK_BACKOFF_MAX_S = 1800.0


def _ask_due(node: Node, now, lease_s: float) -> bool:
    if node.replace_asked_at is None:
        return True  # claimed by a job's pass, never asked
    failed = node.replace_failed_at is not None and node.replace_failed_at >= node.replace_asked_at
    if failed:
        backoff = min(ASK_BACKOFF_MAX_S, ASK_BACKOFF_S * 2 ** max(0, node.replace_failures - 1))
        return now >= node.replace_failed_at + timedelta(seconds=backoff)
    # An ask with no answer past the lease: the pass that made it died.
    return node.replace_asked_at <= now - timedelta(seconds=lease_s)


def ask_owed_replacements(pool, now) -> list[Node]:
    """Ask the provider for claimed nodes it has not replaced: claimed by a
    job's pass and never asked, failed (again after a backoff), or asked by a
    pass that died (past a lease). Each ask is claimed by moving
    `replace_asked_at` on, so two passes never both ask. None while the
    pool's launches fail and it backs off (scaling.py): each would be one
    more machine taken away with no successor coming."""
    owed = list(Node.objects.filter(pool=pool, state=Node.State.REPLACED,
                                    replace_requested_at__isnull=False))
    if not owed or backoff_left(pool, now) > 0:
        return []
    lease_s = REPLACE_LEASE_S
    done = []
    for node in owed:
        if not _ask_due(node, now, lease_s):
            continue
        if not Node.objects.filter(
            pk=node.pk, replace_asked_at=node.replace_asked_at
        ).update(replace_asked_at=now):
            continue  # another pass took this ask
        node.refresh_from_db()
        again = node.replace_failures > 0 or node.events.filter(reason=ASKED).exists()
        reason = "replacement asked again" if again else "replacement asked"
        if _ask_provider(node, reason, now) is not None:
            done.append(node)
    return done
