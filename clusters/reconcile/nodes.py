"""Keep Node rows in step with what the provider reports, and the spare pool full."""

from __future__ import annotations

import json
import logging

from django.db import transaction
from django.db.models import F, Q

from clusters.models import Node, NodeEvent, NodePool
from controlplane.lib.bulk import insert_rows, update_by_ids
from controlplane.lib.transitions import event_time

from .follow import COLUMNS, QUIET, WHOLE, follow, follow_many, plan
from .scaling import check_backoff, note_asked

log = logging.getLogger(__name__)


def sync_pool(pool, provider, info, now) -> None:
    """Bring the pool's rows in step with the provider's nodes. Compares a
    few columns of each row with what the provider reports, and loads the
    whole row, as a model, only of a node whose state may change: a pass
    over a quiet 5,000-node pool made a model object of every row, most of
    its time. Writes shared by many nodes (a spell that touches them all)
    are a statement or a few (`follow_many`), and transitions go one node
    at a time through the model, as ever."""
    reported = {n.name: n for n in provider.list_nodes(info)}
    rows = {row["name"]: row for row in
            Node.objects.filter(cluster_id=pool.cluster_id, pool=pool).order_by("name")
            .values("name", "provider_status", *COLUMNS)}
    _found(pool, [seen for name, seen in reported.items() if name not in rows], now)
    _keep_provider_status(rows, reported)
    grace = pool.cluster.config.node_failure_grace_s
    whole, steps = [], {}
    for name, row in rows.items():
        seen = reported.get(name)
        if seen is None:
            if row["state"] not in Node.RETIRED:
                whole.append(row["id"])
            continue
        if row["state"] == Node.State.PROVISIONING and seen.ready:
            step = WHOLE
        else:
            step = plan(row, seen, grace, now)
        if step == WHOLE:
            whole.append(row["id"])
        elif step != QUIET:
            steps.setdefault(step, []).append((row, seen))
    follow_many(steps, grace, now)
    loaded = Node.objects.in_bulk(whole)
    # Rows were read as the pass began: a job's pass may have moved a node
    # since (cordoned and replaced it), and then what was seen is moot.
    for node_id in whole:  # in the order of their names, as ever
        row = loaded.get(node_id)
        if row is None:
            continue  # deleted meanwhile
        seen = reported.get(row.name)
        if seen is None:
            if row.state not in Node.RETIRED:
                row.transition(Node.State.TERMINATED, reason="no longer at the provider", now=now)
            continue
        if row.state == Node.State.PROVISIONING and seen.ready:
            row.transition(Node.State.READY, reason="provider reports it ready", now=now,
                           still_in=(Node.State.PROVISIONING,))
        follow(row, seen, grace, now)


def _keep_provider_status(rows: dict, reported: dict) -> None:
    """What the provider says of each node, for operators; written only
    where it changed, so a quiet fleet's pass writes nothing. Nodes that
    now report the same conditions (a spell across the fleet) are one
    UPDATE; the rest, one `bulk_update`."""
    shared: dict[str, tuple[dict, list]] = {}
    for name, row in rows.items():
        seen = reported.get(name)
        if seen is not None and row["provider_status"] != seen.conditions:
            key = json.dumps(seen.conditions, sort_keys=True, default=str)
            shared.setdefault(key, (seen.conditions, []))[1].append(row["id"])
    alone = []
    for conditions, ids in shared.values():
        if len(ids) == 1:
            alone.append(Node(id=ids[0], provider_status=dict(conditions)))
        else:
            update_by_ids(Node, ids, provider_status=dict(conditions))
    if alone:
        Node.objects.bulk_update(alone, ["provider_status"], batch_size=500)


FOUND = "found at the provider"
READY = "provider reports it ready"


def _found(pool, new: list, now) -> None:
    """Record the nodes the provider lists that have no row yet, in a few
    statements (a new 10,000-node pool is one pass, not 40,000 round trips;
    no model object per row: controlplane/lib/bulk.py),
    with the events one at a time would have written: found, then ready.

    A job's pass replacing a node records the provider's new machine itself
    and may do so between our listing and here: its row wins (the insert
    skips the name), and only the rows this pass made get our events.

    A new node joins the working set while the pool is short of its size
    with no vacancy owed (how a pool first fills), else as a spare: a node
    left out of service is owed a spare that names it (promotion.py), which
    the pass's `fill_vacancies` promotes, this one if no other is ready.
    Counted under the pool's lock, like a promotion, so the two never fill
    one slot twice."""
    if not new:
        return
    with transaction.atomic():
        size = NodePool.hold(pool.pk).size
        taken = Node.objects.filter(pool=pool, is_spare=False).filter(
            Q(state__in=Node.WORKING)
            | Q(state__in=Node.OUT_OF_SERVICE, successor__isnull=True)).count()
        _insert_found(pool, new, size - taken, now)


def _insert_found(pool, new: list, room: int, now) -> None:
    rows = []
    for seen in new:
        is_spare = room <= 0
        room -= 0 if is_spare else 1
        rows.append({
            "cluster_id": pool.cluster_id, "pool_id": pool.id, "name": seen.name,
            "provider_id": seen.provider_id, "address": seen.address, "gpus": seen.gpus,
            "labels": seen.labels, "provider_status": dict(seen.conditions),
            "is_spare": is_spare,
            "state": Node.State.READY if seen.ready else Node.State.PROVISIONING,
            "state_changed_at": now, "created_at": now,
            "state_reason": READY if seen.ready else FOUND,
        })
    insert_rows(Node, rows, ignore_conflicts=True)
    events = []
    made = Node.objects.filter(pool=pool, created_at=now, state_changed_at=now,
                               state_reason__in=(FOUND, READY)).order_by("id")
    at = event_time(now)
    for node_id, state, is_spare in made.values_list("id", "state", "is_spare"):
        events.append({"node_id": node_id, "from_state": "",
                       "to_state": Node.State.PROVISIONING,
                       "reason": FOUND + (" (spare)" if is_spare else ""), "created_at": at})
        if state == Node.State.READY:
            events.append({"node_id": node_id, "from_state": Node.State.PROVISIONING,
                           "to_state": Node.State.READY, "reason": READY, "created_at": at})
    insert_rows(NodeEvent, events)


def keep_spares(pool, provider, info, now) -> None:
    """Provision the spares the pool lacks; TemporaryError while the pool
    backs off after failed launches (scaling.py)."""
    spares = Node.objects.filter(
        pool=pool, is_spare=True, state__in=(Node.State.PROVISIONING, Node.State.READY)
    ).count()
    # A failed node is on its way to being replaced (claimed by its job's pass
    # or by the health pass, then asked of the provider), and a replaced node
    # whose replacement the provider still owes is too: each brings a spare
    # of its own (replacement.py: the new machine joins as a spare).
    # Provisioning one more for either would leave the pool a machine over.
    owed = Node.objects.filter(
        Q(state=Node.State.FAILED)
        | Q(state=Node.State.REPLACED, replace_requested_at__isnull=False),
        pool=pool,
    ).count()
    missing = max(0, pool.spare_count - spares - owed)
    if missing:
        check_backoff(pool, now)
    for _ in range(missing):
        name = _free_name(pool)
        # Watched from before the ask: a provider that takes it and raises
        # (nothing to show yet) has asked all the same.
        note_asked(pool, now)
        seen = provider.provision_node(info, name)
        row, created = Node.objects.get_or_create(
            cluster_id=pool.cluster_id, name=seen.name,
            defaults={"pool": pool, "provider_id": seen.provider_id, "address": seen.address,
                      "gpus": seen.gpus, "is_spare": True, "state": Node.State.PROVISIONING,
                      "created_at": now},
        )
        if created:
            NodeEvent.objects.create(node=row, from_state="", to_state=Node.State.PROVISIONING,
                                     reason="provisioned to keep the spare pool full",
                                     created_at=now)
        if seen.ready and row.state == Node.State.PROVISIONING:
            row.transition(Node.State.READY, reason="provider reports it ready", now=now)


def hold_spares(pool, provider, info) -> None:
    """The provider keeps the pool's ready spares for Regatta alone (a Slurm
    reservation). Read and told under the pool's lock, which every promotion
    takes: a spare promoted meanwhile is never put back."""
    with transaction.atomic():
        locked = NodePool.hold(pool.pk)
        if locked is None:
            return
        spares = sorted(Node.objects.filter(pool=locked, is_spare=True,
                                            state=Node.State.READY)
                        .values_list("name", flat=True))
        try:
            provider.hold_spares(info, spares)
        except Exception as exc:
            # Keeping spares from others' work protects them; it is not what
            # the pass is for, and they are Regatta's spares either way (an
            # operator's maintenance reservation on one, say): said, and
            # tried again by the next pass.
            log.warning("cluster %s pool %s: spares not held: %s", pool.cluster_id, pool.name,
                        exc)


def _free_name(pool) -> str:
    taken = set(Node.objects.filter(cluster_id=pool.cluster_id).values_list("name", flat=True))
    n = len(taken)
    while True:
        name = f"{pool.cluster.name}-{pool.name}-{n}"
        if name not in taken:
            return name
        n += 1


def account_ready_time(cluster, now) -> None:
    """Add the time since the last pass to every ready node: the denominator
    of the fleet's measured failure rate."""
    if cluster.last_reconciled_at is None:
        return
    delta = (now - cluster.last_reconciled_at).total_seconds()
    if delta <= 0:
        return
    Node.objects.filter(cluster=cluster, state=Node.State.READY).update(
        ready_seconds=F("ready_seconds") + delta
    )


def send_drain(node: Node, provider, info, now) -> None:
    """Ask the provider to drain the node, once per stay in its state."""
    node.refresh_from_db()
    if node.drain_sent:
        return
    provider.drain(info, node.name)
    Node.objects.filter(pk=node.pk).update(drain_sent_at=now)
    NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                             reason="drain sent to the provider", created_at=now)
