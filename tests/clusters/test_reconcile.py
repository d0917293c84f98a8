"""The cluster reconciler on the in-memory provider: node sync, spares,
health signals, drains and replacements."""

import pytest
from django.utils import timezone

from clusters.models import Node, NodeHealthEvent
from clusters.providers import pool_info
from clusters.reconcile import due_cluster_ids, reconcile_cluster
from jobs.models import Phase
from jobs.reconcile import reconcile_job
from tests.fleet_helpers import (
    later,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def cluster(db):
    return memory_cluster(size=3, spares=1)


def test_it_creates_rows_for_new_nodes_with_the_ones_beyond_size_as_spares(cluster):
    nodes = Node.objects.filter(cluster=cluster)
    assert nodes.count() == 4
    assert nodes.filter(is_spare=False, state="ready").count() == 3
    assert nodes.filter(is_spare=True, state="ready").count() == 1
    assert all(n.events.filter(to_state="ready").exists() for n in nodes)


def test_it_marks_nodes_the_provider_no_longer_has_terminated(cluster):
    node = Node.objects.filter(cluster=cluster, is_spare=False).first()
    provider_of(cluster).remove_node(pool_info(node.pool), node.name)
    reconcile_cluster(cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.TERMINATED
    # The pool keeps its working size from the spare, and provisions a new spare.
    assert Node.objects.filter(cluster=cluster, is_spare=False, state="ready").count() == 3
    assert Node.objects.filter(cluster=cluster, is_spare=True).exclude(
        state__in=Node.RETIRED).count() == 1


def test_it_keeps_the_spare_pool_full(cluster):
    pool = cluster.pools.get()
    pool.spare_count = 3
    pool.save()
    reconcile_cluster(cluster.id, timezone.now())
    assert Node.objects.filter(cluster=cluster, is_spare=True, state="ready").count() == 3
    assert len([c for c in provider_of(cluster).fleet.calls if c[0] == "provision_node"]) == 2
    reconcile_cluster(cluster.id, timezone.now())
    assert len([c for c in provider_of(cluster).fleet.calls if c[0] == "provision_node"]) == 2


def test_a_health_signal_is_recorded_once_and_cordons_an_idle_node(cluster):
    node = Node.objects.filter(cluster=cluster, is_spare=False).first()
    provider = provider_of(cluster)
    for _ in range(2):
        provider.signal(pool_info(node.pool), node.name, "xid", message="XID 48", key="x1")
        reconcile_cluster(cluster.id, timezone.now())
    event = NodeHealthEvent.objects.get(node=node)
    assert event.kind == "xid" and event.handled_at is not None
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED
    assert node.events.filter(to_state="cordoned").get().evidence["kind"] == "xid"


def test_a_warning_signal_is_recorded_and_leaves_the_node_alone(cluster):
    node = Node.objects.filter(cluster=cluster, is_spare=False).first()
    provider_of(cluster).signal(pool_info(node.pool), node.name, "thermal",
                                severity="warning", message="81 C")
    reconcile_cluster(cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.READY
    assert NodeHealthEvent.objects.get(node=node).severity == "warning"


def test_an_operator_s_replacement_of_an_idle_node_is_carried_out(cluster):
    node = Node.objects.filter(cluster=cluster, is_spare=False).first()
    Node.objects.filter(pk=node.pk).update(replace_requested_at=timezone.now())
    reconcile_cluster(cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.REPLACED
    assert node.replace_requested_at is None
    assert Node.objects.get(replaces=node).is_spare is False
    assert ("replace", node.name) in provider_of(cluster).fleet.calls


def test_a_drained_node_under_a_job_preempts_the_job_which_resumes_elsewhere(cluster):
    team = team_with_quota(cluster)
    job = submit(cluster, team)
    now = timezone.now()
    reconcile_job(job.id, now)
    attempt = job.attempts.get()
    node = nodes_of(attempt)[0]
    node.drain("maintenance", now=now)
    reconcile_cluster(cluster.id, later(now, 1))
    assert ("drain", node.name) in provider_of(cluster).fleet.calls
    reconcile_job(job.id, later(now, 2))  # asks the trainer for a checkpoint first
    attempt.refresh_from_db()
    assert attempt.checkpoint_request_id
    reconcile_job(job.id, later(now, 200))  # none came within spot_checkpoint_wait_s
    job.refresh_from_db()
    assert job.restart_counts == {"preempted": 1}
    assert job.phase == Phase.STARTING
    assert node.name not in {n.name for n in nodes_of(job.attempts.get(number=2))}
    reconcile_cluster(cluster.id, later(now, 201))
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED  # drained: nothing runs on it now


def test_a_pass_stores_when_to_look_again(cluster):
    now = timezone.now()
    reconcile_cluster(cluster.id, now)
    assert cluster.id not in due_cluster_ids(later(now, 1))
    assert cluster.id in due_cluster_ids(later(now, 60))


def test_a_pool_that_cannot_grow_spares_still_admits_jobs(db):
    """A fixed-size pool (a Kubernetes node group with no Auto Scaling group
    behind it) refuses to provision spares; admission must go on regardless."""
    cluster = memory_cluster(name="mem-fixed", size=2, spares=0)
    pool = cluster.pools.get()
    pool.spare_count = 1
    pool.settings = {"fixed_size": True}
    pool.save()
    team = team_with_quota(cluster)
    job = submit(cluster, team, nodes=1, gpus=2)
    reconcile_job(job.id, timezone.now())
    reconcile_cluster(cluster.id, timezone.now())
    job.refresh_from_db()
    assert job.phase in (Phase.ADMITTED, Phase.STARTING, Phase.RUNNING)
    assert Node.objects.filter(cluster=cluster, is_spare=True).count() == 0
