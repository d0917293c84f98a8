"""Spare accounting: one failure promotes exactly one spare, every replaced
node has exactly one successor, and a pool never runs over its size, even
with cluster passes running while jobs take their nodes out.

The race threads use real database connections each (PostgreSQL row locks
when DATABASE_URL points there, SQLite IMMEDIATE transactions otherwise);
the fleet is the in-memory test double (tests/support/memory_provider.py)."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from clusters.models import Node
from clusters.reconcile import reconcile_cluster_unlocked
from clusters.reconcile.replacement import take_out
from tests.fleet_helpers import memory_cluster

SIZE = 4


def working(pool) -> int:
    return Node.objects.filter(pool=pool, is_spare=False, state="ready").count()


@pytest.mark.usefixtures("fleet_dirs")
def test_a_node_taken_out_has_one_successor_and_the_pool_keeps_its_size(db):
    cluster = memory_cluster(size=SIZE, spares=2)
    pool = cluster.pools.get()
    victim = Node.objects.filter(pool=pool, is_spare=False).order_by("name").first()

    out = take_out(victim, "hardware: killed", {"signal": 9}, timezone.now(),
                   replace_reason="replaced after a hardware failure")
    for _ in range(3):
        reconcile_cluster_unlocked(cluster.id, timezone.now())

    assert out.cordoned and out.spare is not None
    assert list(Node.objects.filter(replaces=victim)) == [out.spare]
    assert working(pool) == SIZE
    assert not Node.objects.filter(pool=pool, is_spare=False, replaces__isnull=True,
                                   events__reason__startswith="promoted").exists()


@pytest.mark.usefixtures("fleet_dirs")
def test_a_cordoned_node_back_in_service_rejoins_as_a_spare(db):
    cluster = memory_cluster(size=SIZE, spares=1)
    pool = cluster.pools.get()
    node = Node.objects.filter(pool=pool, is_spare=False).order_by("name").first()
    node.cordon("maintenance")
    reconcile_cluster_unlocked(cluster.id, timezone.now())  # a spare fills the slot
    assert working(pool) == SIZE

    node.uncordon("maintenance done")

    node.refresh_from_db()
    assert node.state == Node.State.READY and node.is_spare
    assert working(pool) == SIZE
    assert "rejoins as a spare" in node.events.get(to_state="ready",
                                                   from_state="cordoned").reason


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_cluster_passes_racing_a_take_out_promote_one_spare(fleet_dirs):
    """The double promotion a new user saw: a kill's take-out (cordon, then
    the claim) while the cluster's pass found the pool a node short."""
    cluster = memory_cluster(size=SIZE, spares=3)
    pool = cluster.pools.get()
    victims = list(Node.objects.filter(pool=pool, is_spare=False).order_by("name")[:2])
    stop = threading.Event()
    errors = []

    def cluster_passes():
        try:
            while not stop.is_set():
                reconcile_cluster_unlocked(cluster.id, timezone.now())
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    def take_outs():
        try:
            for victim in victims:
                take_out(Node.objects.get(pk=victim.pk), "hardware: killed", {}, timezone.now(),
                         replace_reason="replaced after a hardware failure")
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    passes = threading.Thread(target=cluster_passes)
    passes.start()
    worker = threading.Thread(target=take_outs)
    worker.start()
    worker.join(timeout=60)
    stop.set()
    passes.join(timeout=60)

    assert errors == []
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    for victim in victims:
        assert Node.objects.filter(replaces=victim).count() == 1
    assert working(pool) == SIZE
    assert Node.objects.filter(pool=pool, is_spare=False).exclude(
        state__in=Node.RETIRED).count() == SIZE
