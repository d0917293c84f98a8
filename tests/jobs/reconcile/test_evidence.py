"""A rank that dies with no sign from its node (the OOM killer's SIGKILL) is
relaunched in place, charged to the `process` class; the node goes only on
its own evidence (jobs/reconcile/rank_death.py)."""

import pytest
from django.utils import timezone

from clusters.models import Node, NodeEvent, NodeHealthEvent
from jobs.models import Phase
from jobs.reconcile import budgets, reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    running_job,
    submit,
    team_with_quota,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def cluster(db):
    return memory_cluster(heartbeat_deadline_s=10.0)


def running(cluster, now):
    return running_job(cluster, team_with_quota(cluster), now)


def kill_one_rank(cluster, attempt, node):
    """What torchrun reports when the kernel SIGKILLs one of its ranks: the
    rank's signal, and no exit record from it."""
    provider_of(cluster).exit_node(attempt.provider_ref, node.name, signal=9,
                                   log_tail="exitcode : -9 (pid 4242) Signal 9 (SIGKILL)")


def test_a_rank_killed_on_a_healthy_node_is_relaunched_in_place(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    placed = nodes_of(first)
    working = set(Node.objects.filter(cluster=cluster, is_spare=False)
                  .values_list("name", flat=True))

    kill_one_rank(cluster, first, placed[0])
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    job.refresh_from_db()
    assert first.failure_class == "process"
    second = job.attempts.get(number=2)
    assert nodes_of(second) == placed  # the same nodes, the same ranks
    for node in placed:
        node.refresh_from_db()
        assert node.state == Node.State.READY and node.failure_count == 0
    assert set(Node.objects.filter(cluster=cluster, is_spare=False)
               .values_list("name", flat=True)) == working
    assert not NodeHealthEvent.objects.filter(node__in=placed).exists()
    kinds = list(job.events.values_list("kind", flat=True))
    assert "RankDied" in kinds
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & set(kinds)
    restarting = job.events.get(kind="Restarting")
    assert restarting.evidence["class"] == "process"
    assert restarting.evidence["charged_to_job"] is True
    assert restarting.evidence["health_check"][placed[0].name]["provider_ready"] is True
    assert budgets.summary(job, later(now, 3))["process"] == {"spent": 1, "budget": 3,
                                                               "in_all": 1}
    assert placed[0].events.filter(reason__startswith="a rank died here").exists()


def test_a_second_rank_death_on_the_same_node_takes_the_node_out(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    kill_one_rank(cluster, first, bad)
    reconcile_job_unlocked(job.id, later(now, 3))
    second = job.attempts.get(number=2)
    heartbeat(second, 6, later(now, 4))
    reconcile_job_unlocked(job.id, later(now, 4))

    kill_one_rank(cluster, second, bad)
    reconcile_job_unlocked(job.id, later(now, 6))

    second.refresh_from_db()
    bad.refresh_from_db()
    assert second.failure_class == "hardware"
    assert bad.state == Node.State.REPLACED
    failed = job.events.get(kind="NodeFailed")
    assert failed.evidence["class"] == "hardware"
    restarting = job.events.filter(kind="Restarting").order_by("-id").first()
    assert "failed_again" in restarting.evidence["node_evidence"][bad.name]
    assert bad not in nodes_of(job.attempts.get(number=3))


def test_a_node_the_provider_lost_is_replaced_even_before_the_cluster_pass_sees_it(cluster):
    """The quick health check asks the provider: a node whose processes all
    died because it went is hardware, whichever pass looks first."""
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]

    lose_node(cluster, bad, first.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    bad.refresh_from_db()
    assert first.failure_class == "hardware"
    assert bad.state == Node.State.REPLACED
    restarting = job.events.filter(kind="Restarting").first()
    assert "lost" in restarting.evidence["node_evidence"][bad.name]


def test_a_rank_death_after_a_health_event_on_its_node_is_hardware(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    NodeHealthEvent.objects.create(node=bad, kind="xid", severity="critical",
                                   message="XID 79", created_at=later(now, 2),
                                   handled_at=later(now, 2))

    kill_one_rank(cluster, first, bad)
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    assert first.failure_class == "hardware"
    restarting = job.events.get(kind="Restarting")
    assert restarting.evidence["node_evidence"][bad.name]["health_events"][0]["kind"] == "xid"


def test_the_process_budget_spent_fails_the_job(cluster):
    now = timezone.now()
    job = submit(cluster, team_with_quota(cluster), restart_budgets={"process": 0})
    launch(job, now)
    first = job.attempts.get()
    heartbeat(first, 5, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))

    kill_one_rank(cluster, first, nodes_of(first)[1])
    reconcile_job_unlocked(job.id, later(now, 3))

    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert "'process' restart budget spent" in job.last_error
    assert not NodeEvent.objects.filter(node__in=nodes_of(first), to_state="cordoned").exists()
