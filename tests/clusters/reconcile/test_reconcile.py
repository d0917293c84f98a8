"""The cluster reconciler on the in-memory provider: node sync, spares,
health signals, drains and replacements."""

import pytest
from django.utils import timezone

from clusters.models import Node, NodeHealthEvent
from clusters.providers import pool_info
from clusters.reconcile import due_cluster_ids, reconcile_cluster_unlocked
from clusters.reconcile.replacement import replace_node, take_out
from controlplane.lib.errors import TemporaryError
from jobs.admission import admit
from jobs.models import Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
)
from tests.support import memory_provider

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(size=3, spares=1)


def test_it_creates_rows_for_new_nodes_with_the_ones_beyond_size_as_spares(mem_cluster):
    nodes = Node.objects.filter(cluster=mem_cluster)
    assert nodes.count() == 4
    assert nodes.filter(is_spare=False, state="ready").count() == 3
    assert nodes.filter(is_spare=True, state="ready").count() == 1
    assert all(n.events.filter(to_state="ready").exists() for n in nodes)


def test_it_marks_nodes_the_provider_no_longer_has_terminated(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    provider_of(mem_cluster).remove_node(pool_info(node.pool), node.name)
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.TERMINATED
    # The pool keeps its working size from the spare, and provisions a new spare.
    assert Node.objects.filter(cluster=mem_cluster, is_spare=False, state="ready").count() == 3
    assert Node.objects.filter(cluster=mem_cluster, is_spare=True).exclude(
        state__in=Node.RETIRED).count() == 1


def test_it_keeps_the_spare_pool_full(mem_cluster):
    pool = mem_cluster.pools.get()
    pool.spare_count = 3
    pool.save()
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    assert Node.objects.filter(cluster=mem_cluster, is_spare=True, state="ready").count() == 3
    assert len([c for c in provider_of(mem_cluster).fleet.calls if c[0] == "provision_node"]) == 2
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    assert len([c for c in provider_of(mem_cluster).fleet.calls if c[0] == "provision_node"]) == 2


def test_a_health_signal_is_recorded_once_and_takes_an_idle_node_out_for_a_spare(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    provider = provider_of(mem_cluster)
    for _ in range(2):
        provider.signal(pool_info(node.pool), node.name, "xid", message="XID 48", key="x1")
        reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    event = NodeHealthEvent.objects.get(node=node)
    assert event.kind == "xid" and event.handled_at is not None
    node.refresh_from_db()
    assert node.state == Node.State.REPLACED
    assert node.events.filter(to_state="cordoned").get().evidence["kind"] == "xid"
    (successor,) = Node.objects.filter(replaces=node)
    assert successor.is_spare is False
    working = Node.objects.filter(pool=node.pool, is_spare=False, state="ready")
    assert working.count() == node.pool.size


def test_an_open_event_of_a_node_already_replaced_is_closed(mem_cluster):
    """Recorded while a job's pass was taking the node out (the job saw the
    ranks die first, the cluster pass saw the job still on the node)."""
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    now = timezone.now()
    event = NodeHealthEvent.objects.create(node=node, kind="lost", severity="critical",
                                           message="node lost", created_at=now)
    replace_node(node, "replaced after a hardware failure", now)
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 1))
    event.refresh_from_db()
    assert event.handled_at == later(now, 1)


def test_a_warning_signal_is_recorded_and_leaves_the_node_alone(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    provider_of(mem_cluster).signal(pool_info(node.pool), node.name, "thermal",
                                severity="warning", message="81 C")
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.READY
    assert NodeHealthEvent.objects.get(node=node).severity == "warning"


def test_an_operator_s_replacement_of_an_idle_node_is_carried_out(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    Node.objects.filter(pk=node.pk).update(replace_requested_at=timezone.now())
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    node.refresh_from_db()
    assert node.state == Node.State.REPLACED
    assert node.replace_requested_at is None
    assert Node.objects.get(replaces=node).is_spare is False
    assert ("replace", node.name) in provider_of(mem_cluster).fleet.calls


def claimed_by_a_pass_that_died(node, at):
    """What a pass leaves when it dies after asking the provider for a node's
    replacement (replaced, a spare in its place) and before the answer: the
    machine is still there."""
    node.cordon("xid", now=at)
    node.transition(Node.State.REPLACED, reason="replaced after a hardware failure", now=at,
                    replace_requested_at=at, replace_asked_at=at)


def test_a_replacement_a_job_claimed_is_asked_of_the_provider_by_the_cluster(mem_cluster):
    """A job's pass only claims (cordon, spare promoted): the provider's call,
    a remote one, is the cluster reconcile's."""
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name").first()
    now = timezone.now()
    out = take_out(node, "hardware: killed", {}, now, replace_reason="replaced after a kill",
                   ask_provider=False)
    assert out.spare is not None
    assert ("replace", node.name) not in provider_of(mem_cluster).fleet.calls
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 1))
    node.refresh_from_db()
    assert ("replace", node.name) in provider_of(mem_cluster).fleet.calls
    # Settled; the ask's time stays: the machine is ours to release.
    assert node.replace_requested_at is None and node.replace_asked_at is not None


def test_a_failed_provider_replacement_is_asked_again_after_a_backoff(mem_cluster, monkeypatch):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name").first()
    now = timezone.now()
    take_out(node, "hardware: killed", {}, now, replace_reason="replaced after a kill",
             ask_provider=False)

    def refuse(self, pool, name):
        raise TemporaryError("InsufficientInstanceCapacity for p5.48xlarge")
    monkeypatch.setattr(memory_provider.MemoryProvider, "replace", refuse)
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 1))
    node.refresh_from_db()
    assert node.replace_failures == 1 and "InsufficientInstanceCapacity" in node.replace_error
    assert node.events.filter(reason__contains="InsufficientInstanceCapacity").exists()
    monkeypatch.undo()
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 2))  # within the backoff: not asked
    assert ("replace", node.name) not in provider_of(mem_cluster).fleet.calls
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 60))
    node.refresh_from_db()
    assert ("replace", node.name) in provider_of(mem_cluster).fleet.calls
    assert node.replace_failures == 0 and node.replace_error == ""


def test_a_replacement_whose_provider_call_never_happened_is_asked_again(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name").first()
    now = timezone.now()
    claimed_by_a_pass_that_died(node, later(now, -3600))
    reconcile_cluster_unlocked(mem_cluster.id, now)
    node.refresh_from_db()
    assert ("replace", node.name) in provider_of(mem_cluster).fleet.calls
    assert node.replace_requested_at is None
    assert node.events.filter(reason__startswith="the provider made a new machine for it").exists()
    listed = provider_of(mem_cluster).list_nodes(pool_info(node.pool))
    assert node.name not in {n.name for n in listed}


def test_a_replacement_asked_of_the_provider_moments_ago_is_not_asked_twice(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name").first()
    now = timezone.now()
    claimed_by_a_pass_that_died(node, later(now, -5))  # or still waiting for its machine
    reconcile_cluster_unlocked(mem_cluster.id, now)
    node.refresh_from_db()
    assert ("replace", node.name) not in provider_of(mem_cluster).fleet.calls
    assert node.replace_requested_at == later(now, -5)


def test_replacing_a_node_twice_promotes_one_spare_and_asks_the_provider_once(mem_cluster):
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name").first()
    now = timezone.now()
    first = replace_node(node, "operator", now)
    second = replace_node(node, "a job's failure", later(now, 1))
    assert first[0] is not None and second == (first[0], None)
    assert Node.objects.filter(replaces=node).count() == 1
    assert provider_of(mem_cluster).fleet.calls.count(("replace", node.name)) == 1


def test_a_drained_node_under_a_job_preempts_the_job_which_resumes_elsewhere(mem_cluster):
    team = team_with_quota(mem_cluster)
    job = submit(mem_cluster, team)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    node = nodes_of(attempt)[0]
    node.drain("maintenance", now=now)
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 1))
    assert ("drain", node.name) in provider_of(mem_cluster).fleet.calls
    reconcile_job_unlocked(job.id, later(now, 2))  # asks the trainer for a checkpoint first
    attempt.refresh_from_db()
    assert attempt.checkpoint_request_id
    heartbeat(attempt, 5, later(now, 199))  # the ranks live on, the checkpoint never comes
    reconcile_job_unlocked(job.id, later(now, 200))  # none came within spot_checkpoint_wait_s
    job.refresh_from_db()
    assert job.restart_counts == {"preempted": 1}
    assert job.phase == Phase.STARTING
    assert node.name not in {n.name for n in nodes_of(job.attempts.get(number=2))}
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 201))
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED  # drained: nothing runs on it now


def test_a_pass_stores_when_to_look_again(mem_cluster):
    now = timezone.now()
    reconcile_cluster_unlocked(mem_cluster.id, now)
    assert mem_cluster.id not in due_cluster_ids(later(now, 1))
    assert mem_cluster.id in due_cluster_ids(later(now, 60))


def test_a_pool_that_cannot_grow_spares_still_admits_jobs(db):
    """A fixed-size pool (a Kubernetes node group with no Auto Scaling group
    behind it) refuses to provision spares; admission must go on regardless."""
    mem_cluster = memory_cluster(name="mem-fixed", size=2, spares=0)
    pool = mem_cluster.pools.get()
    pool.spare_count = 1
    pool.settings = {"fixed_size": True}
    pool.save()
    team = team_with_quota(mem_cluster)
    job = submit(mem_cluster, team, nodes=1, gpus=2)
    reconcile_job_unlocked(job.id, timezone.now())
    reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    admit(mem_cluster.id, timezone.now())
    job.refresh_from_db()
    assert job.phase in (Phase.ADMITTED, Phase.STARTING, Phase.RUNNING)
    assert Node.objects.filter(cluster=mem_cluster, is_spare=True).count() == 0
