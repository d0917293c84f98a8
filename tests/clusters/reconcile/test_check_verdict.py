"""A preflight that fails on every node alike blames the check, not the
nodes (clusters/reconcile/check_verdict.py): a gang whose every node fails
the same way launches anyway, and spares failing one after another the same
way stop being cordoned, instead of a pool that cordons a spare and
provisions another on every pass."""

import pytest
from django.utils import timezone

from clusters.models import Node
from clusters.reconcile import reconcile_cluster_unlocked
from tests.fleet_helpers import (
    later,
    launch,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def test_a_gang_whose_every_node_fails_the_check_alike_launches_and_keeps_its_nodes(db):
    cluster = memory_cluster(size=2, spares=1, preflight=True)
    for node in Node.objects.filter(cluster=cluster):
        provider_of(cluster).fail_preflight(node.name)
    Node.objects.filter(cluster=cluster).update(preflight_passed_at=None)
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()

    launch(job, now)

    job.refresh_from_db()
    attempt = job.attempts.get()
    assert attempt.provider_ref, "launched"
    assert set(Node.objects.filter(cluster=cluster).values_list("state", flat=True)) == {"ready"}
    event = job.events.get(kind="PreflightInconclusive")
    assert "the check is suspect, not the nodes" in event.message
    assert not job.events.filter(kind="PreflightFailed").exists()
    cluster.refresh_from_db()
    suspect = next(c for c in cluster.conditions if c["type"] == "PreflightSuspect")
    assert sorted(suspect["nodes"]) == sorted(n.name for n in nodes_of(attempt))


def test_a_node_failing_the_check_its_own_way_is_still_swapped_out(db):
    cluster = memory_cluster(size=3, spares=1, preflight=True)
    job = submit(cluster, team_with_quota(cluster))
    Node.objects.filter(cluster=cluster).update(preflight_passed_at=None)
    bad = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    provider_of(cluster).fail_preflight(bad.name)

    launch(job, timezone.now())

    bad.refresh_from_db()
    assert bad.state == Node.State.CORDONED
    assert job.events.filter(kind="PreflightFailed").exists()
    assert not job.events.filter(kind="PreflightInconclusive").exists()


def test_spares_failing_the_check_one_after_another_alike_stop_being_cordoned(db):
    """Each spare that joins fails the same way: two are cordoned (each
    could be a bad machine), the third makes the check suspect, and from
    then on spares are left alone instead of cordoned and replaced for ever."""
    cluster = memory_cluster(size=1, spares=1, preflight=True)
    provider = provider_of(cluster)
    Node.objects.filter(cluster=cluster, is_spare=True).update(preflight_passed_at=None)
    now = timezone.now()
    before = len([c for c in provider.fleet.calls if c[0] == "preflight"])
    cordoned = []
    working = Node.objects.get(cluster=cluster, is_spare=False)
    for n in range(1, 30):  # every machine the pool has or will get fails alike
        for name in (f"mem-a-gpu-m{n}", f"mem-a-gpu-{n}"):  # found, and provisioned
            if name != working.name:
                provider.fail_preflight(name)
    for i in range(6):
        reconcile_cluster_unlocked(cluster.id, later(now, 5 * i + 1))
        cordoned = list(Node.objects.filter(cluster=cluster, state="cordoned"))

    assert len(cordoned) == 2, [n.name for n in cordoned]
    cluster.refresh_from_db()
    suspect = next(c for c in cluster.conditions if c["type"] == "PreflightSuspect")
    assert len(suspect["nodes"]) == 3
    assert Node.objects.filter(cluster=cluster, is_spare=True, state="ready").count() == 1
    checks = [c for c in provider.fleet.calls if c[0] == "preflight"]
    assert len(checks) - before == 3, "no spare is checked while the check is suspect"
