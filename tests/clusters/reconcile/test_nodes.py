"""Node sync (clusters/reconcile/nodes.py `sync_pool`) on the in-memory
provider: what one pass writes, and that the statements it takes do not
grow with the pool, whether the fleet is quiet or changes all at once."""

from dataclasses import replace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Node, NodePool
from clusters.providers import get_provider, pool_info
from clusters.reconcile.nodes import sync_pool
from tests.fleet_helpers import later, memory_cluster
from tests.support import memory_provider as memory

pytestmark = pytest.mark.usefixtures("fleet_dirs")

UNKNOWN = {"Ready": "Unknown", "MemoryPressure": "Unknown"}
HEALTHY = {"Ready": "True", "MemoryPressure": "False"}


def _report(cluster, names=None, **changes) -> None:
    """The provider now reports the pool's nodes (those in `names`, or all)
    with `changes` (ready, conditions, admin_hold)."""
    pool = NodePool.objects.get(cluster=cluster)
    info = pool_info(pool)
    with memory._LOCK:
        nodes = memory.fleet(cluster.name).nodes[(info.cluster, info.name)]
        for name, seen in list(nodes.items()):
            if names is None or name in names:
                nodes[name] = replace(seen, **changes)


def _sync_queries(cluster, now) -> int:
    """The statements one `sync_pool` pass over the cluster's pool takes."""
    pool = NodePool.objects.select_related("cluster").get(cluster=cluster)
    provider = get_provider(cluster)
    info = pool_info(pool)
    with CaptureQueriesContext(connection) as ctx:
        sync_pool(pool, provider, info, now)
    return len(ctx.captured_queries)


# The larger fleet's writes fit one statement each on SQLite too (999
# parameters: 142 events of 7 columns in an INSERT), so the counts are
# equal there; past that SQLite takes a statement more per batch, PostgreSQL
# none (COPY).
LARGE = 140


def _fleets(db):
    """The same fleet at two sizes, every node ready with the same conditions."""
    small = memory_cluster(name="mem-small", size=10, spares=0, node_failure_grace_s=300)
    large = memory_cluster(name="mem-large", size=LARGE, spares=0, node_failure_grace_s=300)
    for cluster in (small, large):
        _report(cluster, conditions=HEALTHY)
    return small, large


def test_a_quiet_pass_takes_as_many_statements_at_140_nodes_as_at_10(db):
    small, large = _fleets(db)
    now = timezone.now()
    for cluster in (small, large):
        _sync_queries(cluster, now)  # the conditions recorded
    assert _sync_queries(large, later(now, 5)) == _sync_queries(small, later(now, 5)) <= 2


def test_a_fleet_wide_not_ready_spell_costs_no_statement_per_node(db):
    """An API server's stall leaves every node NotReady/Unknown for a while:
    the spell's start, its passes under the grace and its end are each a
    constant count of statements, with every node's events as before."""
    small, large = _fleets(db)
    now = timezone.now()
    for cluster in (small, large):
        _sync_queries(cluster, now)
        _report(cluster, ready=False, conditions=UNKNOWN)

    went = later(now, 5)
    assert _sync_queries(large, went) == _sync_queries(small, went)
    during = later(now, 65)
    assert _sync_queries(large, during) == _sync_queries(small, during) <= 2
    for cluster in (small, large):
        _report(cluster, ready=True, conditions=HEALTHY)
    back = later(now, 125)
    assert _sync_queries(large, back) == _sync_queries(small, back)

    nodes = Node.objects.filter(cluster=large)
    assert nodes.count() == LARGE
    for node in nodes:
        assert node.state == Node.State.READY
        assert node.not_ready_since is None
        assert node.provider_status == HEALTHY
        notes = list(node.events.filter(from_state="ready", to_state="ready")
                     .order_by("created_at", "id").values_list("reason", "evidence"))
        assert notes == [
            ("the provider reports it not ready; it fails if that lasts 300 s",
             {"provider_status": UNKNOWN}),
            ("ready again after 120 s: no failure", {"provider_status": HEALTHY}),
        ]


def test_a_pass_follows_each_node_as_the_provider_reports_it(db):
    """Holds, spells past the grace, nodes gone and nodes quiet, in one pass:
    the transitions, notes and health events each node gets."""
    cluster = memory_cluster(name="mem-mixed", size=6, spares=0, node_failure_grace_s=60)
    now = timezone.now()
    names = list(Node.objects.filter(cluster=cluster).order_by("name")
                 .values_list("name", flat=True))
    held, failing, gone, spell, quiet, back = names
    _report(cluster, [held, back], admin_hold="maintenance by ops")
    _report(cluster, [failing], ready=False, conditions=UNKNOWN)
    pool = NodePool.objects.get(cluster=cluster)
    get_provider(cluster).remove_node(pool_info(pool), gone)
    _sync_queries(cluster, now)
    _report(cluster, [back], admin_hold="")
    _report(cluster, [spell], ready=False, conditions=UNKNOWN)
    _sync_queries(cluster, later(now, 61))

    def timeline(name):
        node = Node.objects.get(cluster=cluster, name=name)
        return node, [(e.from_state, e.to_state, e.reason, e.actor) for e in
                      node.events.order_by("created_at", "id")][2:]  # after found, ready

    node, events = timeline(held)
    assert node.state == Node.State.CORDONED and node.admin_hold == "maintenance by ops"
    assert events == [("ready", "cordoned", "held by the scheduler: maintenance by ops",
                       "scheduler")]
    node, events = timeline(failing)
    assert node.state in (Node.State.FAILED, Node.State.REPLACED)
    assert node.failure_count == 1 and node.not_ready_since is None
    assert events[0] == ("ready", "ready", "the provider reports it not ready; it fails if "
                         "that lasts 60 s", "reconciler")
    assert events[1] == ("ready", "failed", "not ready for 61 s at the provider", "reconciler")
    assert node.health_events.filter(kind="lost", severity="critical").count() == 1
    node, events = timeline(gone)
    assert node.state == Node.State.TERMINATED
    assert events == [("ready", "terminated", "no longer at the provider", "reconciler")]
    node, events = timeline(back)
    assert node.state == Node.State.READY and node.admin_hold == ""
    assert events == [
        ("ready", "cordoned", "held by the scheduler: maintenance by ops", "scheduler"),
        ("cordoned", "ready", "the scheduler's hold lifted (maintenance by ops)", "scheduler")]
    node, events = timeline(spell)
    assert node.state == Node.State.READY and node.not_ready_since == later(now, 61)
    assert events == [("ready", "ready", "the provider reports it not ready; it fails if "
                       "that lasts 60 s", "reconciler")]
    node, events = timeline(quiet)
    assert node.state == Node.State.READY and events == []
