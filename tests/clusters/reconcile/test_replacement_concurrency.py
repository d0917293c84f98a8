"""Replacing one node from several passes at once (the cluster reconcile and
a job reconcile, under different locks) promotes one spare and asks the
provider once: real threads, each with its own database connection, against
PostgreSQL when DATABASE_URL points there (row locks) and SQLite otherwise
(IMMEDIATE transactions)."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from clusters.models import Node, NodeEvent
from clusters.reconcile.replacement import replace_node
from tests.fleet_helpers import memory_cluster, provider_of

PASSES = 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_passes_replacing_one_node_at_once_promote_one_spare_and_ask_the_provider_once(
        fleet_dirs):
    cluster = memory_cluster(size=2, spares=PASSES)
    node = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    start = threading.Barrier(PASSES)
    results, errors = [], []

    def replace(i):
        try:
            row = Node.objects.get(pk=node.pk)
            start.wait(timeout=30)
            spare, new = replace_node(row, f"pass {i}", timezone.now())
            results.append((spare.pk if spare else None, new.pk if new else None))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=replace, args=(i,)) for i in range(PASSES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert errors == []
    node.refresh_from_db()
    assert node.state == Node.State.REPLACED
    assert node.replace_requested_at is None  # the provider's part is done
    promoted = Node.objects.filter(replaces=node)
    assert promoted.count() == 1
    assert Node.objects.filter(cluster=cluster, is_spare=True, state="ready").count() == PASSES
    calls = [c for c in provider_of(cluster).fleet.calls if c == ("replace", node.name)]
    assert len(calls) == 1
    # Every pass answers with the one spare; one of them also got the new machine.
    assert {spare for spare, _ in results} == {promoted.get().pk}
    assert len([new for _, new in results if new is not None]) == 1
    assert NodeEvent.objects.filter(node=node, to_state="replaced",
                                    from_state__in=["cordoned", "ready"]).count() == 1
