"""Restart budgets that forgive the fleet (jobs/recovery/budgets.py): node faults are
charged to the nodes, a window of progress forgives old failures, and an
ended job runs again from a chosen checkpoint. In-memory provider, real
PostgreSQL."""

import pytest
from django.utils import timezone

from checkpoints.export import export_final
from checkpoints.models import Checkpoint, ModelArtifact
from clusters.models import Node
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.admission import admit
from jobs.checkpointing import open_job_storage
from jobs.models import JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from jobs.services import rerun_job
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    report_not_ready,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")

TRANSIENT_RANKS = ({"rank": 0, "exit_code": 84, "failure_class": "transient"},
                   {"rank": 1, "exit_code": 84, "failure_class": "transient"})


@pytest.fixture
def spares_cluster(db):
    # Two working nodes and six spares: every kill below finds one.
    return memory_cluster(size=2, spares=6, heartbeat_deadline_s=10.0)


def latest(job):
    return job.attempts.order_by("-number").first()


def run_to(job, step, at):
    """The newest attempt reports `step` and the job sees it running."""
    attempt = latest(job)
    heartbeat(attempt, step, at)
    reconcile_job_unlocked(job.id, at)
    job.refresh_from_db()
    return attempt


def test_six_node_kills_with_spares_do_not_fail_the_job_and_are_charged_to_the_nodes(
        spares_cluster):
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team)
    launch(job, now)
    killed = []
    for n in range(6):
        t = later(now, 10 * n + 1)
        attempt = run_to(job, 5 + n, t)
        assert job.phase == Phase.RUNNING
        bad = nodes_of(attempt)[0]
        lose_node(spares_cluster, bad, attempt.provider_ref)
        reconcile_cluster_unlocked(spares_cluster.id, later(t, 1))
        reconcile_job_unlocked(job.id, later(t, 2))
        job.refresh_from_db()
        assert job.phase != Phase.FAILED, job.last_error
        killed.append(bad)
    # All six restarts happened; none was the job's to pay for.
    assert job.restart_counts == {"hardware": 6}
    assert job.budget_spent == {}
    for node in killed:
        node.refresh_from_db()
        assert node.state == Node.State.REPLACED
        assert node.failure_count == 1
    restarting = JobEvent.objects.filter(job=job, kind="Restarting").order_by("id")
    assert [e.evidence["charged_to_job"] for e in restarting] == [False] * 6
    assert "charged to the node" in restarting.last().evidence["why"]
    assert "not charged to the job" in restarting.last().message
    assert job.attempts.count() == 7


def test_a_job_that_keeps_failing_on_fresh_nodes_is_charged_from_the_third(spares_cluster):
    """Nodes that went with no health event to confirm a node fault (the
    provider only reports them not ready), each time a node that never failed."""
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team)
    launch(job, now)
    charged = []
    for n in range(4):
        t = later(now, 10 * n + 1)
        attempt = run_to(job, 5, t)
        bad = nodes_of(attempt)[0]
        assert bad.failure_count == 0  # fresh
        report_not_ready(spares_cluster, bad)
        provider_of(spares_cluster).exit_node(attempt.provider_ref, bad.name, signal=9)
        reconcile_job_unlocked(job.id, later(t, 2))
        job.refresh_from_db()
        charged.append(JobEvent.objects.filter(job=job, kind="Restarting")
                       .latest("id").evidence["charged_to_job"])
    assert charged == [False, False, True, True]
    assert job.phase != Phase.FAILED
    assert job.restart_counts == {"hardware": 4} and job.budget_spent == {"hardware": 2}
    assert job.restart_marks["fresh_nodes"]["count"] == 4


def test_a_kill_on_a_node_with_a_failure_history_breaks_the_fresh_streak(spares_cluster):
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team)
    launch(job, now)
    for n in range(4):
        t = later(now, 10 * n + 1)
        attempt = run_to(job, 5, t)
        bad = nodes_of(attempt)[0]
        if n == 2:  # this one has failed before: it, not the job, is suspect
            Node.objects.filter(pk=bad.pk).update(failure_count=3)
        report_not_ready(spares_cluster, bad)
        provider_of(spares_cluster).exit_node(attempt.provider_ref, bad.name, signal=9)
        reconcile_job_unlocked(job.id, later(t, 2))
        job.refresh_from_db()
    assert job.budget_spent == {}
    assert job.restart_marks["fresh_nodes"]["count"] == 1


def _transient_failure(cluster, job, t):
    attempt = latest(job)
    for node in nodes_of(attempt):
        provider_of(cluster).exit_node(attempt.provider_ref, node.name, exit_code=1,
                                       ranks=TRANSIENT_RANKS)
    reconcile_job_unlocked(job.id, t)
    job.refresh_from_db()


@pytest.mark.parametrize("progress_s, progress_steps, survives", [
    (5, 200, True),      # advanced 200 steps past the window of 100
    (120, 10, True),     # 2 minutes past the window of 1 minute
    (5, 10, False),      # neither: the budget of 1 is spent
])
def test_a_budget_resets_once_the_job_advanced_past_its_window(
        spares_cluster, progress_s, progress_steps, survives):
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team, budget_reset_steps=100, budget_reset_minutes=1,
                 restart_budgets={"code": 0, "transient": 1, "hardware": 5, "preempted": 10,
                                  "hang": 3})
    launch(job, now)
    run_to(job, 50, later(now, 1))
    _transient_failure(spares_cluster, job, later(now, 2))
    assert job.budget_spent == {"transient": 1}
    # After its backoff the job relaunches and makes progress.
    backoff = JobEvent.objects.get(job=job, kind="Restarting").evidence["backoff_s"]
    t = later(now, 2 + backoff + 0.5)
    reconcile_job_unlocked(job.id, t)
    job.refresh_from_db()
    at = later(t, progress_s)
    run_to(job, 50 + progress_steps, at)
    assert job.phase == Phase.RUNNING
    _transient_failure(spares_cluster, job, later(at, 1))
    if survives:
        assert job.phase == Phase.RESTARTING
        assert job.budget_spent == {"transient": 1} and job.restart_counts == {"transient": 2}
        event = JobEvent.objects.filter(job=job, kind="Restarting").latest("id")
        assert event.evidence["window_reset"] is True
    else:
        assert job.phase == Phase.FAILED
        assert "'transient' restart budget spent (1 of 1" in job.last_error


def test_a_failed_job_reruns_from_a_chosen_step_as_a_new_run(spares_cluster, django_user_model):
    team = team_with_quota(spares_cluster)
    user = django_user_model.objects.create_user("olivia")
    now = timezone.now()
    job = submit(spares_cluster, team, created_by=user,
                 restart_budgets={"code": 0, "transient": 0, "hardware": 5, "preempted": 10,
                                  "hang": 3})
    launch(job, now)
    first = run_to(job, 12, later(now, 1))
    write_checkpoint(job, 5, first)
    write_checkpoint(job, 10, first)
    _transient_failure(spares_cluster, job, later(now, 2))
    assert job.phase == Phase.FAILED

    rerun_job(job, 5, user)
    job.refresh_from_db()
    assert (job.phase, job.generation, job.restart_counts) == (Phase.QUEUED, 2, {})
    admit(job.cluster_id, later(now, 3))
    reconcile_job_unlocked(job.id, later(now, 3))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    second = latest(job)
    assert second.number == 2 and second.resume_step == 5
    env = provider_of(spares_cluster).attempt(second.provider_ref).request.env
    assert env["REGATTA_RESUME_STEP"] == "5"  # not the newer step 10
    resumed = JobEvent.objects.filter(job=job, kind="ResumedFromCheckpoint").latest("id")
    assert resumed.evidence["step"] == 5
    # The old run's step 10 is on the branch the rerun left: never resumed from.
    assert Checkpoint.objects.get(job=job, step=10).state == Checkpoint.State.ABANDONED
    rerun = JobEvent.objects.get(job=job, kind="Rerun")
    assert rerun.actor == "user:olivia" and rerun.evidence["from_step"] == 5


def test_a_forgiven_fault_with_no_node_to_be_had_waits_in_the_queue(db):
    cluster = memory_cluster(name="mem-tight", size=2, spares=0, heartbeat_deadline_s=10.0)
    team = team_with_quota(cluster)
    now = timezone.now()
    job = submit(cluster, team)
    launch(job, now)
    attempt = run_to(job, 5, later(now, 1))
    bad = nodes_of(attempt)[0]
    lose_node(cluster, bad, attempt.provider_ref)
    reconcile_cluster_unlocked(cluster.id, later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 3))
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED, job.last_error
    assert job.pending_reason
    assert job.budget_spent == {} and job.restart_counts == {"hardware": 1}
    assert JobEvent.objects.filter(job=job, kind="Requeued").exists()
    # The provider's replacement arrives: the job is admitted and resumes.
    for s in (4, 5, 6):
        reconcile_cluster_unlocked(cluster.id, later(now, s))
    admit(cluster.id, later(now, 7))
    reconcile_job_unlocked(job.id, later(now, 7))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.pending_reason
    assert latest(job).number == 2


def test_a_rerun_of_a_job_that_succeeded_exports_a_new_version(spares_cluster,
                                                               django_user_model):
    team = team_with_quota(spares_cluster)
    user = django_user_model.objects.create_user("olivia")
    job = submit(spares_cluster, team, created_by=user)
    first = write_checkpoint(job, 20)
    now = timezone.now()
    one = export_final(job, first, open_job_storage(job), now)
    second = write_checkpoint(job, 30)
    two = export_final(job, second, open_job_storage(job), later(now, 1))
    assert (one.version, two.version) == (1, 2)
    assert export_final(job, second, open_job_storage(job), later(now, 2)) == two  # idempotent
    assert ModelArtifact.objects.filter(job=job).count() == 2


def test_ranks_exiting_83_with_no_notice_are_forgiven_but_not_forever(spares_cluster):
    """A stop of the control plane (Ctrl-C of `make run`) costs nothing; a
    program that exits 83 by itself in a loop is charged from the third."""
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team,
                 restart_budgets={"code": 0, "transient": 3, "hardware": 5, "preempted": 0,
                                  "hang": 3})
    launch(job, now)
    for n in range(3):
        t = later(now, 10 * n + 1)
        attempt = run_to(job, 5, t)
        for i, node in enumerate(nodes_of(attempt)):
            provider_of(spares_cluster).exit_node(
                attempt.provider_ref, node.name, exit_code=83,
                ranks=({"rank": 2 * i, "exit_code": 83}, {"rank": 2 * i + 1, "exit_code": 83}))
        reconcile_job_unlocked(job.id, later(t, 2))
        job.refresh_from_db()
        if n < 2:
            assert job.phase != Phase.FAILED, job.last_error
    assert job.phase == Phase.FAILED
    assert "'preempted' restart budget spent" in job.last_error
    assert job.restart_counts == {"preempted": 3}


def test_stops_of_the_control_plane_are_never_charged_to_the_job(spares_cluster):
    """Ctrl-C of `make run` (regatta_up.stop_local_training) notes the stop on
    the attempt before its ranks checkpoint and exit 83."""
    team = team_with_quota(spares_cluster)
    now = timezone.now()
    job = submit(spares_cluster, team,
                 restart_budgets={"code": 0, "transient": 3, "hardware": 5, "preempted": 0,
                                  "hang": 3})
    launch(job, now)
    for n in range(4):
        t = later(now, 10 * n + 1)
        attempt = run_to(job, 5, t)
        attempt.note_stop_by_control_plane(t)
        attempt.refresh_from_db()
        assert attempt.directives()["stop"] is True  # carried on heartbeats too
        for i, node in enumerate(nodes_of(attempt)):
            provider_of(spares_cluster).exit_node(
                attempt.provider_ref, node.name, exit_code=83,
                ranks=({"rank": 2 * i, "exit_code": 83}, {"rank": 2 * i + 1, "exit_code": 83}))
        reconcile_job_unlocked(job.id, later(t, 2))
        job.refresh_from_db()
        assert job.phase != Phase.FAILED, job.last_error
    assert job.restart_counts == {"preempted": 4} and job.budget_spent == {}
    restarting = JobEvent.objects.filter(job=job, kind="Restarting").latest("id")
    assert restarting.evidence["source"] == "control_plane_stop"
