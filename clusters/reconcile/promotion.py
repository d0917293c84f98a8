"""Who takes a spare out of the pool: one function, under the pool's lock.

A working node that leaves service (cordoned, failed, drained, replaced,
gone from the provider) leaves a vacancy: its slot in the pool's `size`. A
spare is promoted only into a vacancy, and names it (`replaces`, and the
vacancy's `successor`), so:

- a pool never has more working nodes than its size: the count and the
  promotion are one step under the pool's row lock (`NodePool.hold`), and
  every other way into the working set (a node back in service, a node found
  at the provider) takes the same lock;
- every promotion names the node it replaces;
- one failure takes one spare: a vacancy with a successor is filled, whoever
  acts on the node next (the cluster pass that saw the provider report it
  failed, then the job pass that claims it) promotes nothing more;
- a spare that fails is no vacancy: the pool's working set is untouched, and
  `keep_spares` (or the provider's replacement, which joins as a spare)
  brings the spare count back.

Every pass that may leave a vacancy calls `fill_vacancies`: the claim of a
node (so a job's relaunch finds the spare in the same pass), a preflight
swap at a launch, and the cluster pass (the safety net, e.g. for a node an
operator cordoned). Each call fills what is owed and no more, so calling it
twice, or from two workers at once, promotes once.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from clusters.models import Node, NodeEvent, NodePool

PROMOTED = "promoted from the spare pool"


def fill_vacancies(pool, now, *, first: Node | None = None) -> list[Node]:
    """Promote a ready spare into each vacancy of the pool that the pool's
    size leaves room for, oldest vacancy first (`first`, the node a caller
    just took out, before the others: a job waits on it). Returns the spares
    promoted by this call."""
    promoted = []
    with transaction.atomic():
        locked = NodePool.hold(pool.pk)
        if locked is None:
            return []
        working = Node.objects.filter(pool=locked, is_spare=False,
                                      state__in=Node.WORKING).count()
        room = locked.size - working
        if room <= 0:
            return []
        vacancies = list(
            Node.objects.filter(pool=locked, is_spare=False, state__in=Node.OUT_OF_SERVICE,
                                successor__isnull=True)
            .order_by("state_changed_at", "id")
        )
        if first is not None:
            vacancies.sort(key=lambda n: n.pk != first.pk)  # stable: the rest keep their order
        for vacancy in vacancies[:room]:
            spare = _promote(locked, vacancy, now)
            if spare is None:
                break  # no ready spare left: the rest stay owed
            promoted.append(spare)
    return promoted


def _promote(pool: NodePool, vacancy: Node, now) -> Node | None:
    """Turn one ready spare into a working node in `vacancy`'s slot: the one
    that passed a preflight check most recently (clusters/reconcile/spares.py),
    so the relaunch it joins can skip the check; else the oldest."""
    spare = (
        Node.objects.select_for_update(skip_locked=True)
        .filter(pool=pool, is_spare=True, state=Node.State.READY)
        .order_by(F("preflight_passed_at").desc(nulls_last=True), "created_at", "id")
        .first()
    )
    if spare is None:
        return None
    Node.objects.filter(pk=spare.pk).update(is_spare=False, replaces=vacancy,
                                            state_reason=PROMOTED)
    Node.objects.filter(pk=vacancy.pk).update(successor=spare)
    NodeEvent.objects.create(
        node=spare, from_state=spare.state, to_state=spare.state,
        reason=f"{PROMOTED} to replace {vacancy.name}",
        evidence={"replaces": vacancy.name, "replaces_state": vacancy.state},
        created_at=now,
    )
    spare.refresh_from_db()
    return spare
