"""The goodput ledger: categories booked once, GPU-seconds, restart latency,
the first attempt's start-up, and a running job's time so far."""

import pytest
from django.utils import timezone

from jobs import goodput
from jobs.goodput.models import GoodputEntry
from jobs.reconcile import reconcile_job_unlocked
from tests.conftest import client_for
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def test_booking_a_key_twice_stores_it_once(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    goodput.book(job, "productive", 10.0, "k")
    goodput.book(job, "productive", 99.0, "k")
    entry = GoodputEntry.objects.get(job=job)
    assert entry.seconds == 10.0 and entry.gpu_seconds == 40.0


def test_restart_latency_runs_from_the_failure_to_the_next_first_step(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)
    first = job.attempts.get()
    heartbeat(first, 3, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    provider_of(cluster).exit_node(first.provider_ref, nodes_of(first)[0].name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 10))  # failure detected and relaunched at +10 s
    second = job.attempts.get(number=2)
    heartbeat(second, 1, later(now, 16))
    reconcile_job_unlocked(job.id, later(now, 16))
    reconcile_job_unlocked(job.id, later(now, 17))
    restart = GoodputEntry.objects.get(job=job, key=f"restart-{second.id}")
    assert restart.seconds == pytest.approx(6.0)
    assert restart.gpu_seconds == pytest.approx(24.0)
    summary = goodput.summarize(job.goodput.all())
    # 6 s from the failure; the 1 s from admission to attempt 1's first step
    # is start-up, not a restart's.
    assert summary["categories"]["restart"]["seconds"] == pytest.approx(6.0)
    assert summary["categories"]["startup"]["seconds"] == pytest.approx(1.0)
    # 9 s from the first step to the failure, none of it saved by a checkpoint.
    assert summary["categories"]["rollback"]["seconds"] == pytest.approx(9.0)
    # Attempt 2 has run for 1 s since its first step.
    assert summary["categories"]["productive"]["seconds"] == pytest.approx(1.0)


def test_the_first_attempt_s_start_up_is_booked_as_start_up_not_restart_latency(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)  # admitted and launched at `now`
    attempt = job.attempts.get()
    heartbeat(attempt, 1, later(now, 4))
    reconcile_job_unlocked(job.id, later(now, 4))
    # Nothing restarted: no restart latency at all.
    assert not GoodputEntry.objects.filter(job=job, category="restart").exists()
    startup = GoodputEntry.objects.get(job=job, category="startup")
    assert startup.key == f"startup-{attempt.id}"
    assert startup.seconds == pytest.approx(4.0)
    assert startup.gpu_seconds == pytest.approx(4.0 * job.world_size)
    assert "start-up" in startup.detail
    reconcile_job_unlocked(job.id, later(now, 8))
    summary = goodput.summarize(job.goodput.all())
    # 4 s of start-up against 4 s of training: the ratio is not overstated.
    assert summary["goodput_ratio"] == pytest.approx(0.5)


def test_a_running_job_shows_its_time_so_far_in_the_api_and_books_it_once(db,
                                                                          django_user_model):
    cluster = memory_cluster()
    team = team_with_quota(cluster)
    user = django_user_model.objects.create_user("olivia", password="pw-olivia")
    team.members.add(user)
    job = submit(cluster, team)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 1, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    write_checkpoint(job, 5, attempt, blocking_s=0.5, created_at=later(now, 5))
    heartbeat(attempt, 9, later(now, 11))
    reconcile_job_unlocked(job.id, later(now, 11))

    data = client_for(user).get(f"/api/v1/jobs/{job.pk}/goodput/").data
    # 10 s since the first step, less the 0.5 s checkpoint stall.
    assert data["categories"]["productive"]["seconds"] == pytest.approx(9.5)
    assert data["categories"]["productive"]["gpu_seconds"] == pytest.approx(9.5 * job.world_size)
    assert data["categories"]["checkpoint"]["seconds"] == pytest.approx(0.5)
    assert data["categories"]["startup"]["seconds"] == pytest.approx(1.0)
    assert data["categories"]["restart"]["seconds"] == 0
    team_data = client_for(user).get(f"/api/v1/teams/{team.name}/goodput/").data
    assert team_data["categories"]["productive"]["seconds"] == pytest.approx(9.5)

    write_checkpoint(job, 20, attempt, blocking_s=0.5, created_at=later(now, 19))
    heartbeat(attempt, 20, later(now, 19))
    provider_of(cluster).finish(attempt.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 20))
    job.refresh_from_db()
    assert job.phase == "succeeded"
    # The running figures were replaced by the final ones, not added to them.
    productive = GoodputEntry.objects.get(job=job, category="productive")
    assert productive.seconds == pytest.approx(19.0 - 1.0)
    assert GoodputEntry.objects.get(job=job, category="checkpoint").seconds == pytest.approx(1.0)
    data = client_for(user).get(f"/api/v1/jobs/{job.pk}/goodput/").data
    assert data["categories"]["productive"]["seconds"] == pytest.approx(18.0)


def test_a_pass_that_comes_after_the_attempt_ended_leaves_its_final_figures(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 2, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    provider_of(cluster).exit_node(attempt.provider_ref, nodes_of(attempt)[0].name, signal=9)
    reconcile_job_unlocked(job.id, later(now, 5))
    attempt.refresh_from_db()
    assert attempt.ended_at is not None
    # A late pass (a worker that read the attempt before it ended) changes nothing.
    goodput.book_running(job, attempt, later(now, 50))
    attempt.ended_at = None
    goodput.book_running(job, attempt, later(now, 50))
    productive = GoodputEntry.objects.get(job=job, category="productive")
    assert productive.seconds == pytest.approx(0.0)  # all 4 s rolled back
    assert GoodputEntry.objects.get(job=job, category="rollback").seconds == pytest.approx(4.0)
