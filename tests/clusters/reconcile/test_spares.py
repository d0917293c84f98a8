"""Spares are checked when they join (clusters/reconcile/spares.py), so the
relaunch a promoted spare joins can skip its preflight."""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from clusters.providers import PreflightResult, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from clusters.reconcile.replacement import replace_node
from clusters.reconcile.spares import _settle
from jobs.models import JobAttempt
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    later,
    launch,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
)
from tests.support import memory_provider as memory

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def preflight_calls(cluster) -> list[tuple]:
    return [c[1] for c in provider_of(cluster).fleet.calls if c[0] == "preflight"]


def cluster_with_bad_spare(name="mem-bad", size=2):
    """A pool whose one spare fails any check, before the first pass sees it."""
    cluster = Cluster.objects.create(name=name, provider=memory.KIND)
    pool = NodePool.objects.create(cluster=cluster, name="gpu", gpus_per_node=2, size=size,
                                   spare_count=1)
    provider = memory.MemoryProvider(cluster.name)
    *_, last = provider.add_nodes(pool_info(pool), size + 1)
    provider.fail_preflight(last.name)  # the node beyond `size` joins as the spare
    return cluster, last.name


def test_a_spare_is_checked_once_when_it_joins(db):
    now = timezone.now()
    cluster = memory_cluster(name="mem-join", size=3, spares=1)
    spare = Node.objects.get(cluster=cluster, is_spare=True)
    assert preflight_calls(cluster) == [(spare.name,)]
    assert spare.preflight_passed_at is not None and spare.preflight_passed_at >= now
    joined = spare.events.get(reason="passed its preflight check on joining")
    assert joined.evidence["preflight"] == {"ok": True, "busbw_gbps": 10.0}
    # Working nodes are checked at their first launch, not here.
    assert not Node.objects.filter(cluster=cluster, is_spare=False).exclude(
        preflight_passed_at=None).exists()

    reconcile_cluster_unlocked(cluster.id, later(now, 60))
    assert len(preflight_calls(cluster)) == 1  # still fresh: not checked again


def test_a_spare_whose_pass_grew_old_is_checked_again(db):
    cluster = memory_cluster(name="mem-old", size=2, spares=1, preflight_max_age_s=600)
    spare = Node.objects.get(cluster=cluster, is_spare=True)
    passed = spare.preflight_passed_at
    reconcile_cluster_unlocked(cluster.id, later(passed, 601))
    spare.refresh_from_db()
    assert len(preflight_calls(cluster)) == 2
    assert spare.preflight_passed_at == later(passed, 601)


def test_one_spare_is_checked_per_pass(db):
    cluster = memory_cluster(name="mem-two", size=2, spares=2)
    spares = Node.objects.filter(cluster=cluster, is_spare=True)
    assert spares.exclude(preflight_passed_at=None).count() == 1
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    assert spares.exclude(preflight_passed_at=None).count() == 2
    assert len(preflight_calls(cluster)) == 2


def test_a_spare_that_fails_its_join_check_is_cordoned_never_promoted_and_replaced(db):
    cluster, bad_name = cluster_with_bad_spare()
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)

    bad = Node.objects.get(cluster=cluster, name=bad_name)
    assert bad.is_spare and bad.state == Node.State.CORDONED
    assert bad.preflight_passed_at is None and bad.failure_count == 1
    health = bad.health_events.get()
    assert (health.kind, health.severity) == ("nccl_test", "critical")
    assert health.handled_at == now  # nothing runs there: the cordon is the action
    assert health.evidence["preflight"] == {"ok": False, "check": "allreduce",
                                            "error": "collective test failed"}
    assert health.evidence["when"] == "joining"
    cordoned = bad.events.get(to_state="cordoned")
    assert cordoned.reason.startswith("failed its preflight check on joining")
    assert cordoned.evidence == health.evidence

    # The next pass provisions a spare in its place and checks that one.
    reconcile_cluster_unlocked(cluster.id, later(now, 5))
    new = Node.objects.get(cluster=cluster, is_spare=True, state=Node.State.READY)
    assert new.name != bad_name and new.preflight_passed_at == later(now, 5)
    assert ("provision_node", new.name) in provider_of(cluster).fleet.calls

    working = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    promoted, _ = replace_node(working, "operator asked", later(now, 6))
    assert promoted == new
    bad.refresh_from_db()
    assert bad.is_spare and bad.state == Node.State.CORDONED


def test_promotion_prefers_a_spare_that_passed_its_check(db):
    cluster = memory_cluster(name="mem-pref", size=2, spares=2)
    first, second = Node.objects.filter(cluster=cluster, is_spare=True).order_by("created_at",
                                                                                  "id")
    now = timezone.now()
    Node.objects.filter(pk=first.pk).update(preflight_passed_at=None)
    Node.objects.filter(pk=second.pk).update(preflight_passed_at=now)
    working = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()

    promoted, _ = replace_node(working, "operator asked", now)

    assert promoted == second


def test_a_spare_a_job_took_while_it_was_checked_fails_the_job_not_a_cordon(db):
    """The check and a promotion can race: a failing result for a node that
    now runs a job becomes an open critical event, which the job acts on."""
    cluster = memory_cluster(name="mem-race", size=2, spares=1)
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)
    node = nodes_of(job.attempts.get())[0]
    result = PreflightResult(ok=False, failed_nodes=(node.name,),
                             evidence={"per_node": {node.name: {"ok": False, "check": "x",
                                                                "error": "bad link"}}},
                             message=f"collective test failed on {node.name}")

    _settle(node, result, later(now, 1))

    node.refresh_from_db()
    assert node.state == Node.State.READY
    event = NodeHealthEvent.objects.get(node=node)
    assert event.handled_at is None and event.severity == "critical"
    reconcile_job_unlocked(job.id, later(now, 2))
    first = job.attempts.get(number=1)
    assert first.state == JobAttempt.State.FAILED and first.failure_class == "hardware"
    node.refresh_from_db()
    assert node.state == Node.State.REPLACED
