"""Failure handling on real torchrun processes: a killed node, a hung rank,
a code error, a spot notice and a node that fails its preflight check."""

import pytest

from checkpoints.models import Checkpoint
from clusters.models import Node, NodeEvent, NodeHealthEvent
from clusters.providers import pool_info
from jobs.models import Phase

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def refreshed(obj):
    obj.refresh_from_db()
    return obj


def running(job, number=1, min_step=1):
    def check():
        attempt = job.attempts.filter(number=number, state="running").first()
        return attempt if attempt and attempt.last_step >= min_step else None
    return check


def cancel_and_wait(fleet, job):
    job.request_cancel("test")
    from jobs import tasks

    tasks.reconcile_job.delay(job.id)
    fleet.wait("the job cancelled", lambda: refreshed(job).phase == Phase.CANCELLED, job=job,
               timeout=60)


@pytest.mark.timeout(240)
def test_a_killed_node_is_taken_out_replaced_from_the_spares_and_the_job_resumes(fleet):
    """The README's demo: kill a node; the timeline shows the failure with its
    evidence, the node taken out of service, the spare that replaced it and
    the step the job resumed from; the node's "lost" event is handled."""
    cluster = fleet.cluster()
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    attempt = fleet.wait("attempt 1 past its first checkpoint", running(job, 1, 7), job=job)
    node = attempt.placements.get(node_rank=1).node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "kill")
    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    lost = fleet.wait("the lost event handled", lambda: NodeHealthEvent.objects.filter(
        node=node, kind="lost", handled_at__isnull=False).first(), job=job, timeout=30)
    assert lost.severity == "critical"
    attempt.refresh_from_db()
    assert attempt.failure_class == "hardware"
    kinds = list(job.events.values_list("kind", flat=True))
    first = kinds.index("NodeFailed")
    # The job's reconcile cordons the node, unless the node's own "lost"
    # report, handled by the cluster's reconcile, took it out first
    # (jobs/recovery/handle.py `_take_out`): the two race, and either way
    # the timeline says why the node is out before its replacement.
    out_kind = kinds[first + 1]
    assert out_kind in ("NodeCordoned", "NodeOutOfService")
    assert kinds[first:first + 4] == ["NodeFailed", out_kind, "NodeReplaced", "Restarting"]
    assert kinds.index("Restarting") < kinds.index("ResumedFromCheckpoint")
    failed = job.events.get(kind="NodeFailed")
    assert failed.evidence["node"] == node.name
    out = job.events.get(kind=out_kind)
    assert out.evidence["node"] == node.name
    spare = Node.objects.get(replaces=node)
    replaced = job.events.get(kind="NodeReplaced")
    assert replaced.evidence["old"] == node.name and replaced.evidence["new"] == spare.name
    resumed = job.events.get(kind="ResumedFromCheckpoint")
    assert resumed.evidence["step"] >= 5 and second.resume_step == resumed.evidence["step"]
    assert spare.name in set(second.placements.values_list("node__name", flat=True))
    # One failure, one spare, naming the node (preflight is off here: which
    # spare is the pre-checked one is pinned in tests/clusters/reconcile/test_spare_paths.py).
    promotions = NodeEvent.objects.filter(node__cluster=cluster,
                                          reason__startswith="promoted from the spare pool")
    assert [(e.node.name, e.evidence["replaces"]) for e in promotions] == [(spare.name,
                                                                            node.name)]
    pool = node.pool
    assert Node.objects.filter(pool=pool, is_spare=False,
                               state__in=Node.WORKING).count() <= pool.size
    assert refreshed(node).state == Node.State.REPLACED
    assert node.events.filter(to_state__in=[Node.State.CORDONED, Node.State.FAILED]).exists()
    assert not NodeHealthEvent.objects.filter(node__cluster=cluster, severity="critical",
                                              handled_at__isnull=True).exists()
    cancel_and_wait(fleet, job)


@pytest.mark.timeout(240)
def test_a_rank_killed_on_a_healthy_node_is_relaunched_in_place(fleet):
    """The OOM killer's SIGKILL of one rank: no node is cordoned or replaced,
    the gang relaunches on the same nodes, charged to the `process` class."""
    cluster = fleet.cluster()
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    attempt = fleet.wait("attempt 1 running", running(job, 1, 3), job=job)
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    node = attempt.placements.get(node_rank=1).node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "kill_rank")
    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    attempt.refresh_from_db()
    assert attempt.failure_class == "process"
    assert list(second.placements.order_by("node_rank")
                .values_list("node__name", flat=True)) == placed
    assert refreshed(node).state == Node.State.READY and not node.is_spare
    kinds = set(job.events.values_list("kind", flat=True))
    assert "RankDied" in kinds and not {"NodeCordoned", "NodeReplaced"} & kinds
    assert job.events.get(kind="Restarting").evidence["class"] == "process"
    assert not NodeEvent.objects.filter(node__cluster=cluster,
                                        reason__startswith="promoted from the spare").exists()
    cancel_and_wait(fleet, job)


@pytest.mark.timeout(300)
def test_a_hung_rank_is_found_by_its_missed_heartbeats_and_its_node_fails_its_check(fleet):
    """Silent ranks make their node a suspect, not a casualty: the relaunch
    checks it first, and a hung node fails the check (the local fleet's
    preflight fails a hung node as a hung GPU fails an all-reduce), so it
    is cordoned with that evidence and the spare takes its place."""
    cluster = fleet.cluster(heartbeat_deadline_s=4.0, preflight=True)
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    attempt = fleet.wait("attempt 1 running", running(job, 1, 3), job=job, timeout=150)
    node = attempt.placements.get(node_rank=1).node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "hang")
    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"
    restarting = job.events.get(kind="Restarting")
    assert [s["rank"] for s in restarting.evidence["silent"]] == [1], fleet.story(job)
    assert restarting.evidence.get("suspects") == [node.name], fleet.story(job)
    assert refreshed(node).state == Node.State.CORDONED
    assert node.health_events.filter(kind="nccl_test").exists()
    assert job.events.get(kind="PreflightFailed").evidence["node"] == node.name
    assert node not in [p.node for p in second.placements.all()]
    assert job.goodput.get(category="hang").seconds >= 4.0
    cancel_and_wait(fleet, job)


@pytest.mark.timeout(180)
def test_a_code_error_fails_fast_without_spending_the_hardware_budget(fleet):
    cluster = fleet.cluster()
    job = fleet.submit(cluster, max_steps=50, fail_at_step=3)
    fleet.wait("the job failed", lambda: refreshed(job).phase == Phase.FAILED, job=job)
    assert job.restart_counts == {"code": 1}
    assert "'code' restart budget" in job.last_error
    assert job.attempts.count() == 1
    assert job.attempts.get().failure_class == "code"
    assert not Node.objects.filter(cluster=cluster).exclude(state="ready").exists()


@pytest.mark.timeout(240)
def test_a_spot_notice_leaves_an_emergency_checkpoint_before_the_drain(fleet):
    cluster = fleet.cluster(spot_checkpoint_wait_s=60.0)
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    attempt = fleet.wait("attempt 1 running", running(job, 1, 3), job=job)
    node = attempt.placements.get(node_rank=0).node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "spot_notice")
    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    attempt.refresh_from_db()
    emergency = Checkpoint.objects.get(job=job, request_id=attempt.checkpoint_request_id)
    # Ranks train on until they are stopped, so a periodic save may land after
    # the emergency one; the resume takes the newest verified, never an older one.
    assert second.resume_step >= emergency.step
    kinds = list(job.events.values_list("kind", flat=True))
    assert kinds.index("EmergencyCheckpointRequested") < kinds.index(
        "EmergencyCheckpointCommitted") < kinds.index("NodeDrained") < kinds.index("Restarting")
    assert NodeHealthEvent.objects.get(node=node, kind="spot_notice").handled_at is not None
    assert refreshed(node).state == Node.State.REPLACED
    assert refreshed(job).restart_counts == {"preempted": 1}
    cancel_and_wait(fleet, job)


@pytest.mark.timeout(240)
def test_a_node_that_fails_its_preflight_check_is_cordoned_and_the_job_starts_on_another(fleet):
    cluster = fleet.cluster(preflight=True)
    bad = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    fleet.provider(cluster).inject_fault(pool_info(bad.pool), bad.name, "preflight_fail")
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    attempt = fleet.wait("attempt 1 running", running(job, 1), job=job, timeout=150)
    assert refreshed(bad).state == Node.State.CORDONED
    assert bad.health_events.get(kind="nccl_test").severity == "critical"
    assert bad.name not in set(attempt.placements.values_list("node__name", flat=True))
    assert attempt.preflight["ok"] is True
    assert job.events.filter(kind="PreflightFailed").exists()
    cancel_and_wait(fleet, job)
