"""Failure detection, classification, budgets and recovery on the in-memory provider."""

from pathlib import Path

import pytest
from django.utils import timezone

from checkpoints.models import Checkpoint
from clusters.models import Node, NodeHealthEvent
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.goodput.models import GoodputEntry
from jobs.models import JobAttempt, JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from jobs.worker_api.tokens import issue as issue_token
from tests.api_factories import worker_client
from tests.fleet_helpers import (
    heartbeat,
    kinds,
    later,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    report_not_ready,
    running_job,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(heartbeat_deadline_s=10.0, spot_checkpoint_wait_s=30.0)



def test_it_replaces_a_node_whose_ranks_were_killed_and_resumes_from_the_checkpoint(
        mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 10, attempt, created_at=later(now, 5))
    heartbeat(attempt, 14, later(now, 8))
    bad, good = nodes_of(attempt)
    provider = provider_of(mem_cluster)
    report_not_ready(mem_cluster, bad)  # the node went, not only its ranks
    provider.exit_node(attempt.provider_ref, bad.name, exit_code=1, signal=9, log_tail="Killed")
    provider.exit_node(attempt.provider_ref, good.name, exit_code=1,
                       ranks=({"rank": 2, "exit_code": 84, "failure_class": "transient"},
                              {"rank": 3, "exit_code": 84, "failure_class": "transient"}))
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    attempt.refresh_from_db()
    bad.refresh_from_db()
    # One hardware failure of the killed node; the peers' 84 is collateral.
    assert attempt.failure_class == "hardware"
    assert job.restart_counts == {"hardware": 1}
    assert bad.state == Node.State.REPLACED
    assert bad.failure_count == 1
    spare = Node.objects.get(replaces=bad)
    assert spare.is_spare is False
    failed = JobEvent.objects.get(job=job, kind="NodeFailed")
    assert failed.evidence["node"] == bad.name and failed.evidence["signal"] == 9
    assert failed.evidence["log_tail"] == "Killed"
    replaced = JobEvent.objects.get(job=job, kind="NodeReplaced")
    assert replaced.evidence["old"] == bad.name and replaced.evidence["new"] == spare.name
    # The job's pass only claimed the replacement; the cluster's asks the
    # provider, which brings a new spare up in the retired node's place.
    assert ("replace", bad.name) not in provider.fleet.calls
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 10))
    assert ("replace", bad.name) in provider.fleet.calls
    assert Node.objects.filter(cluster=mem_cluster, is_spare=True, state="ready").count() == 1
    assert job.phase == Phase.STARTING  # relaunched in the same pass
    second = job.attempts.get(number=2)
    assert {n.name for n in nodes_of(second)} == {good.name, spare.name}
    assert second.resume_step == 10
    resumed = JobEvent.objects.get(job=job, kind="ResumedFromCheckpoint")
    assert resumed.evidence["step"] == 10 and resumed.evidence["steps_lost"] == 4
    assert resumed.evidence["seconds_lost"] == pytest.approx(5.0)
    env = provider.attempt(second.provider_ref).request.env
    assert env["REGATTA_RESUME_STEP"] == "10"
    # The spare passed its check when it joined, the survivor at the first
    # launch: the relaunch skips the preflight.
    assert kinds(job)[-7:] == ["NodeFailed", "NodeCordoned", "NodeReplaced", "Restarting",
                               "PreflightSkipped", "Launched", "ResumedFromCheckpoint"]
    rollback = GoodputEntry.objects.get(job=job, category="rollback")
    assert rollback.seconds == pytest.approx(5.0)
    assert rollback.gpu_seconds == pytest.approx(5.0 * job.world_size)


def test_a_hand_over_recorded_after_the_failure_was_handled_lowers_its_rollback_line(
        mem_cluster, mem_team):
    """The survivors' hand-over of the last step can land between the pass
    that books the failure (against the periodic save) and the launch that
    resumes from it: the ledger then says what the resume says."""
    from jobs.signals import launch_point

    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 5, attempt, created_at=later(now, 3))
    heartbeat(attempt, 10, later(now, 8))
    bad, good = nodes_of(attempt)
    report_not_ready(mem_cluster, bad)
    provider_of(mem_cluster).exit_node(attempt.provider_ref, bad.name, exit_code=1, signal=9)

    def hand_over(sender, point, **kwargs):
        # After end_attempt booked the failure, before the launch picks its checkpoint.
        if point == "launch" and not Checkpoint.objects.filter(job=job, step=10).exists():
            write_checkpoint(job, 10, attempt, emergency=True, created_at=later(now, 9.5))

    launch_point.connect(hand_over, weak=False)
    try:
        reconcile_job_unlocked(job.id, later(now, 10))
    finally:
        launch_point.disconnect(hand_over)

    resumed = JobEvent.objects.get(job=job, kind="ResumedFromCheckpoint")
    assert resumed.evidence["step"] == 10 and resumed.evidence["steps_lost"] == 0
    assert resumed.evidence["seconds_lost"] == pytest.approx(0.5)
    # Booked as 7 s back to step 5 when the failure was handled; the resume
    # lost 0.5 s, and the other 6.5 s were trained.
    rollback = GoodputEntry.objects.get(job=job, category="rollback")
    assert rollback.seconds == pytest.approx(0.5)
    assert rollback.gpu_seconds == pytest.approx(0.5 * job.world_size)
    assert rollback.detail == "rolled back to step 10: 0 steps lost"
    productive = GoodputEntry.objects.get(job=job, key=f"attempt-{attempt.id}-productive")
    assert productive.seconds == pytest.approx(10.0 - 0.5 - 1.0, abs=0.2)  # less the start-up


def test_a_killed_node_shows_failure_cordon_replacement_and_resume_on_the_timeline(
        mem_cluster, mem_team):
    """The README's "kill a node": the cluster pass sees the node not ready,
    fails it once that outlasted the grace (ready → failed), and records
    its "lost" event before the job looks."""
    now = timezone.now()
    mem_cluster.settings = {**mem_cluster.settings, "node_failure_grace_s": 1.0}
    mem_cluster.save()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 5, attempt, created_at=later(now, 3))
    heartbeat(attempt, 7, later(now, 4))
    bad, good = nodes_of(attempt)
    lose_node(mem_cluster, bad, attempt.provider_ref)
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 4))
    bad.refresh_from_db()
    assert bad.state == Node.State.READY, "not ready for a moment is no failure yet"
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 5))
    bad.refresh_from_db()
    assert bad.state == Node.State.FAILED
    lost = NodeHealthEvent.objects.filter(node=bad, kind="lost", handled_at__isnull=True)
    assert lost.exists()  # a job runs there: the job acts on it

    reconcile_job_unlocked(job.id, later(now, 6))
    job.refresh_from_db()
    order = kinds(job)
    first = order.index("NodeFailed")
    assert order[first:] == ["NodeFailed", "NodeCordoned", "NodeReplaced", "Restarting",
                             "PreflightSkipped", "Launched", "ResumedFromCheckpoint"]
    failed = JobEvent.objects.get(job=job, kind="NodeFailed")
    assert failed.evidence["node"] == bad.name and failed.evidence["signal"] == 9
    assert {e["id"] for e in failed.evidence["health_events"]} == set(
        NodeHealthEvent.objects.filter(node=bad, kind="lost").values_list("id", flat=True))
    cordoned = JobEvent.objects.get(job=job, kind="NodeCordoned")
    assert cordoned.evidence["node"] == bad.name and cordoned.evidence["was"] == "failed"
    assert cordoned.evidence["provider_report"]["reason"] == "not ready for 1 s at the provider"
    spare = Node.objects.get(replaces=bad)
    replaced = JobEvent.objects.get(job=job, kind="NodeReplaced")
    assert replaced.evidence["old"] == bad.name and replaced.evidence["new"] == spare.name
    assert JobEvent.objects.get(job=job, kind="ResumedFromCheckpoint").evidence["step"] == 5
    assert set(NodeHealthEvent.objects.filter(node=bad, kind="lost").values_list(
        "handled_at", flat=True)) == {later(now, 6)}
    bad.refresh_from_db()
    assert bad.state == Node.State.REPLACED
    assert [e.to_state for e in bad.events.order_by("created_at", "id")
            if e.to_state != e.from_state] == ["provisioning", "ready", "failed", "cordoned",
                                               "replaced"]
    assert bad.failure_count == 1  # the provider's report counted it; the cordon does not
    assert {n.name for n in nodes_of(job.attempts.get(number=2))} == {good.name, spare.name}


def test_a_lost_event_the_job_sees_before_its_exits_is_handled_by_the_recovery(mem_cluster,
                                                                                mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad = nodes_of(attempt)[0]
    lose_node(mem_cluster, bad)  # the ranks on it are not seen dead yet
    reconcile_cluster_unlocked(mem_cluster.id, later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 3))
    job.refresh_from_db()
    assert job.restart_counts == {"hardware": 1}
    assert NodeHealthEvent.objects.get(node=bad, kind="lost").handled_at is not None
    assert not NodeHealthEvent.objects.filter(node__cluster=mem_cluster, severity="critical",
                                              handled_at__isnull=True).exists()
    order = kinds(job)
    assert order[order.index("NodeFailed"):order.index("NodeFailed") + 4] == [
        "NodeFailed", "NodeCordoned", "NodeReplaced", "Restarting"]


def test_a_node_already_out_of_service_says_why_on_the_timeline(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad = nodes_of(attempt)[0]
    bad.cordon("cordoned by opal: flaky fan", actor="user:opal", now=later(now, 2))
    provider_of(mem_cluster).exit_node(attempt.provider_ref, bad.name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 3))
    order = kinds(job)
    assert order[order.index("NodeFailed"):order.index("NodeFailed") + 4] == [
        "NodeFailed", "NodeOutOfService", "NodeReplaced", "Restarting"]
    out = JobEvent.objects.get(job=job, kind="NodeOutOfService")
    assert out.evidence["state"] == "cordoned"
    assert out.evidence["node_event"]["reason"] == "cordoned by opal: flaky fan"
    bad.refresh_from_db()
    assert bad.state == Node.State.REPLACED


def test_a_code_error_fails_fast_without_spending_the_hardware_budget(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    node = nodes_of(attempt)[0]
    provider_of(mem_cluster).exit_node(
        attempt.provider_ref, node.name, exit_code=1,
        ranks=({"rank": 0, "exit_code": 1, "failure_class": "code",
                "error": "ValueError: fail_at_step=3"},))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    node.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert "'code' restart budget" in job.last_error and "fail_at_step=3" in job.last_error
    assert job.restart_counts == {"code": 1}
    assert node.state == Node.State.READY  # the node did nothing wrong
    assert job.attempts.count() == 1


def test_a_transient_failure_retries_with_backoff_on_the_same_nodes(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    first_nodes = {n.name for n in nodes_of(attempt)}
    provider = provider_of(mem_cluster)
    for node in first_nodes:
        provider.exit_node(attempt.provider_ref, node, exit_code=1,
                           ranks=({"rank": 0, "exit_code": 84}, {"rank": 1, "exit_code": 84}))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    assert job.phase == Phase.RESTARTING
    assert job.restart_counts == {"transient": 1}
    reconcile_job_unlocked(job.id, later(now, 3))  # inside the 2 s backoff
    assert job.attempts.count() == 1
    reconcile_job_unlocked(job.id, later(now, 4.5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    assert {n.name for n in nodes_of(job.attempts.get(number=2))} == first_nodes
    assert not Node.objects.filter(cluster=mem_cluster, state="cordoned").exists()


def test_a_transient_exit_waits_for_the_root_cause_before_it_is_classified(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad, good = nodes_of(attempt)
    provider = provider_of(mem_cluster)
    provider.exit_node(attempt.provider_ref, good.name, exit_code=1,
                       ranks=({"rank": 2, "exit_code": 84}, {"rank": 3, "exit_code": 84}))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING  # the killed node's launcher has not reported yet
    provider.exit_node(attempt.provider_ref, bad.name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 3))
    job.refresh_from_db()
    # The killed rank is the root cause; its node is healthy: in place.
    assert job.restart_counts == {"process": 1}


def test_a_rank_without_an_exit_record_beside_its_peers_84_was_killed(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad, good = nodes_of(attempt)
    provider = provider_of(mem_cluster)
    # torchrun on `bad` exits 1: rank 1 was SIGKILLed (no record), rank 0 saw its peer go.
    provider.exit_node(attempt.provider_ref, bad.name, exit_code=1,
                       ranks=({"rank": 0, "exit_code": 84},))
    provider.exit_node(attempt.provider_ref, good.name, exit_code=1,
                       ranks=({"rank": 2, "exit_code": 84}, {"rank": 3, "exit_code": 84}))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    bad.refresh_from_db()
    good.refresh_from_db()
    # No sign from the node itself: a rank death, relaunched in place
    # (tests/jobs/reconcile/test_rank_death.py).
    assert job.restart_counts == {"process": 1}
    assert bad.state == Node.State.READY and good.state == Node.State.READY


def test_a_spent_budget_fails_the_job_and_says_which_budget(mem_cluster, mem_team):
    """A lost fresh node with no health event to confirm it is
    forgiven twice; the third in a row is the job's (jobs/recovery/budgets.py)."""
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now,
                               restart_budgets={"hardware": 0, "code": 0, "transient": 3,
                                                "preempted": 3, "hang": 1})
    for n in range(3):
        attempt = job.attempts.order_by("-number").first()
        heartbeat(attempt, 5 + n, later(now, 2 + 2 * n))
        bad = nodes_of(attempt)[0]
        report_not_ready(mem_cluster, bad)
        provider_of(mem_cluster).exit_node(attempt.provider_ref, bad.name, signal=9)
        reconcile_job_unlocked(job.id, later(now, 3 + 2 * n))
        job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert job.last_error.startswith("hardware failure with the 'hardware' restart budget spent")
    assert "nodes that never failed before" in job.last_error
    assert bad.name in job.last_error
    assert job.restart_counts == {"hardware": 3} and job.budget_spent == {"hardware": 1}
    bad.refresh_from_db()
    assert bad.state == Node.State.REPLACED  # the evidence still takes the node out
    assert bad.failure_count == 1


def test_a_hung_rank_is_found_by_its_missed_heartbeats(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad, good = nodes_of(attempt)
    heartbeat(attempt, 8, later(now, 5), ranks=[0, 1])  # ranks 0-1 live on `bad`
    heartbeat(attempt, 8, later(now, 20), ranks=[2, 3])
    reconcile_job_unlocked(job.id, later(now, 12))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING  # 7 s silent: within the 10 s deadline
    reconcile_job_unlocked(job.id, later(now, 20))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"
    assert job.restart_counts == {"hang": 1}
    # Silent ranks make their node a suspect, checked before the relaunch
    # uses it (jobs/recovery/evidence.py): this one passes, and stays.
    bad.refresh_from_db()
    assert bad.state == Node.State.READY and bad.failure_count == 0
    hang = GoodputEntry.objects.get(job=job, category="hang")
    assert hang.seconds == pytest.approx(15.0)
    silent = JobEvent.objects.get(job=job, kind="RanksSilent")
    assert silent.evidence["node"] == bad.name
    assert {s["rank"] for s in silent.evidence["silent"]} == {0, 1}
    restarting = JobEvent.objects.get(job=job, kind="Restarting")
    assert restarting.evidence["suspects"] == [bad.name]
    assert job.events.filter(kind="PreflightPassed",
                             attempt=job.attempts.get(number=2)).exists()


def test_a_critical_health_event_on_a_node_replaces_it(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    bad = nodes_of(attempt)[1]
    event = NodeHealthEvent.objects.create(node=bad, kind="xid", severity="critical",
                                           message="XID 79: GPU fell off the bus")
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    event.refresh_from_db()
    assert event.handled_at is not None
    assert job.restart_counts == {"hardware": 1}
    assert "XID 79" in JobEvent.objects.get(job=job, kind="Restarting").message
    bad.refresh_from_db()
    assert bad.state == Node.State.REPLACED


def test_a_spot_notice_takes_an_emergency_checkpoint_before_the_drain(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    spot = nodes_of(attempt)[0]
    NodeHealthEvent.objects.create(node=spot, kind="spot_notice", severity="critical",
                                   message="interruption in 120 s")
    reconcile_job_unlocked(job.id, later(now, 2))
    attempt.refresh_from_db()
    request_id = attempt.checkpoint_request_id
    assert request_id and attempt.directives()["checkpoint_request"] == request_id
    assert ("drain", spot.name) not in provider_of(mem_cluster).fleet.calls
    reconcile_job_unlocked(job.id, later(now, 3))  # no checkpoint yet: keep waiting
    assert job.attempts.count() == 1
    write_checkpoint(job, 7, attempt, request_id=request_id, emergency=True,
                     created_at=later(now, 4))
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    spot.refresh_from_db()
    assert ("drain", spot.name) in provider_of(mem_cluster).fleet.calls
    assert spot.state == Node.State.REPLACED
    assert job.restart_counts == {"preempted": 1}
    assert job.attempts.get(number=2).resume_step == 7
    order = kinds(job)
    assert order.index("EmergencyCheckpointRequested") < order.index(
        "EmergencyCheckpointCommitted") < order.index("NodeDrained") < order.index("Restarting")


def test_a_spot_notice_without_a_checkpoint_in_time_resumes_from_the_newest(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 4, attempt, created_at=later(now, 1))
    spot = nodes_of(attempt)[0]
    NodeHealthEvent.objects.create(node=spot, kind="spot_notice", severity="critical",
                                   message="interruption")
    reconcile_job_unlocked(job.id, later(now, 2))
    heartbeat(attempt, 6, later(now, 39))
    reconcile_job_unlocked(job.id, later(now, 40))
    job.refresh_from_db()
    assert "EmergencyCheckpointMissed" in kinds(job)
    assert job.attempts.get(number=2).resume_step == 4


def test_the_emergency_checkpoint_wait_ends_before_the_notice_s_own_deadline(mem_cluster, mem_team):
    """spot_checkpoint_wait_s is 30 s; the machine goes 20 s after the notice
    is acted on, and stopping the gang needs its 10 s margin: wait 10 s."""
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 4, attempt, created_at=later(now, 1))
    spot = nodes_of(attempt)[0]
    NodeHealthEvent.objects.create(
        node=spot, kind="spot_notice", severity="critical", message="terminate in 20 s",
        evidence={"action": "terminate", "time": later(now, 22).timestamp()})
    reconcile_job_unlocked(job.id, later(now, 2))
    asked = JobEvent.objects.get(job=job, kind="EmergencyCheckpointRequested")
    assert asked.evidence["wait_s"] == pytest.approx(10.0)
    assert asked.evidence["deadline"] == pytest.approx(later(now, 22).timestamp())
    heartbeat(attempt, 6, later(now, 11))
    reconcile_job_unlocked(job.id, later(now, 11))
    assert job.attempts.count() == 1  # still inside the 10 s
    heartbeat(attempt, 7, later(now, 12))
    reconcile_job_unlocked(job.id, later(now, 12.5))
    job.refresh_from_db()
    missed = JobEvent.objects.get(job=job, kind="EmergencyCheckpointMissed")
    assert missed.evidence["wait_s"] == pytest.approx(10.0)
    assert job.restart_counts == {"preempted": 1}
    assert job.attempts.get(number=2).resume_step == 4
    assert ("drain", spot.name) in provider_of(mem_cluster).fleet.calls


def test_an_ec2_warning_s_deadline_is_two_minutes_after_it_was_sent(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    spot = nodes_of(attempt)[0]
    sent = later(now, -115)  # the warning sat in the queue: 5 s of its 120 are left
    NodeHealthEvent.objects.create(
        node=spot, kind="spot_notice", severity="critical", message="EC2 warning",
        evidence={"detail_type": "EC2 Spot Instance Interruption Warning",
                  "time": sent.isoformat().replace("+00:00", "Z")})
    reconcile_job_unlocked(job.id, later(now, 2))
    asked = JobEvent.objects.get(job=job, kind="EmergencyCheckpointRequested")
    assert asked.evidence["deadline"] == pytest.approx(later(now, 5).timestamp())
    assert asked.evidence["wait_s"] == 0.0  # past deadline − margin: drain at once
    reconcile_job_unlocked(job.id, later(now, 2.1))
    job.refresh_from_db()
    assert job.restart_counts == {"preempted": 1}


def test_a_corrupt_checkpoint_is_skipped_for_the_previous_good_one(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 5, attempt, created_at=later(now, 1))
    newest = write_checkpoint(job, 10, attempt, created_at=later(now, 2))
    shard = next(Path(newest.uri.removeprefix("file://")).glob("*.distcp"))
    shard.write_bytes(b"garbage")
    provider_of(mem_cluster).exit_node(attempt.provider_ref, nodes_of(attempt)[0].name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 3))
    newest.refresh_from_db()
    assert newest.state == Checkpoint.State.CORRUPT
    assert job.attempts.get(number=2).resume_step == 5
    assert "CheckpointCorrupt" in kinds(job)


def test_a_person_s_restart_from_step_is_honoured_once(mem_cluster, mem_team):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    write_checkpoint(job, 4, attempt, created_at=later(now, 1))
    write_checkpoint(job, 8, attempt, created_at=later(now, 2))
    job.request_restart(4, "olivia", now=later(now, 3))
    reconcile_job_unlocked(job.id, later(now, 3))
    job.refresh_from_db()
    second = job.attempts.get(number=2)
    assert second.resume_step == 4
    honoured = next(c for c in job.conditions if c["type"] == "RestartFromStep")
    assert honoured["generation"] == job.generation and honoured["step"] == 4
    assert job.restart_counts == {}  # a person's restart spends no budget
    provider_of(mem_cluster).exit_node(second.provider_ref, nodes_of(second)[0].name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 5))
    # Step 8 is on the branch the restart left: the next failure does not
    # fall forward onto it.
    assert job.attempts.get(number=3).resume_step == 4
    assert JobAttempt.objects.filter(job=job).count() == 3
    assert Checkpoint.objects.get(job=job, step=8).state == Checkpoint.State.ABANDONED


def test_the_old_gangs_late_checkpoint_past_a_restart_point_is_abandoned_never_offered(
        mem_cluster, mem_team, api, admin_user_):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    token = issue_token(attempt)
    write_checkpoint(job, 4, attempt, created_at=later(now, 1))
    job.request_restart(4, "olivia", now=later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 2))
    # The old gang's emergency checkpoint of its stop arrives after the relaunch.
    late = write_checkpoint(job, 9, None, created_at=later(now, 3))
    Checkpoint.objects.filter(pk=late.pk).delete()  # only its files and the report now
    resp = worker_client(token).post(
        f"/api/v1/worker/attempts/{attempt.pk}/checkpoints",
        {"step": 9, "uri": late.uri, "manifest_sha256": late.manifest_sha256, "emergency": True},
        format="json")
    assert resp.status_code == 201, resp.content
    assert Checkpoint.objects.get(job=job, step=9).state == Checkpoint.State.ABANDONED
    second = job.attempts.get(number=2)
    provider_of(mem_cluster).exit_node(second.provider_ref, nodes_of(second)[0].name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 5))
    assert job.attempts.get(number=3).resume_step == 4
    refused = api(admin_user_).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 9},
                                    format="json")
    assert refused.status_code == 409  # no checkpoint at that step to restart from


def test_ranks_that_exit_83_after_an_emergency_checkpoint_are_preempted_not_failed(
    mem_cluster, mem_team
):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, mem_team, now)
    provider = provider_of(mem_cluster)
    for i, node in enumerate(nodes_of(attempt)):
        provider.exit_node(attempt.provider_ref, node.name, exit_code=83,
                           ranks=({"rank": 2 * i, "exit_code": 83},
                                  {"rank": 2 * i + 1, "exit_code": 83}))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    assert job.restart_counts == {"preempted": 1}
    assert job.events.filter(kind="NodePreempted").count() == 2
    assert not job.events.filter(kind="NodeFailed").exists()
