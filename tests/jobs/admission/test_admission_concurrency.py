"""20 submissions admitted at once never overshoot a quota: real threads,
each with its own database connection, against PostgreSQL when DATABASE_URL
points there (row locks) and SQLite otherwise (IMMEDIATE transactions)."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from jobs.admission import admit
from jobs.models import Phase, TrainingJob
from tests.fleet_helpers import memory_cluster, submit, team_with_quota


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_twenty_concurrent_submissions_never_overshoot_a_quota(fleet_dirs):
    cluster = memory_cluster(size=16, spares=0)
    team = team_with_quota(cluster, gpus=8, max_running_jobs=20)
    start = threading.Barrier(20)
    errors = []

    def submit_and_admit(i):
        try:
            job = submit(cluster, team, name=f"job-{i}", nodes=1, gpus=2)
            job.transition(Phase.QUEUED, reason="Queued")
            start.wait(timeout=30)
            admit(cluster.id, timezone.now())
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit_and_admit, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert errors == []
    admitted = TrainingJob.objects.filter(team=team, phase=Phase.ADMITTED)
    assert sum(j.world_size for j in admitted) <= 8
    assert admitted.count() == 4
    waiting = TrainingJob.objects.filter(team=team, phase=Phase.QUEUED)
    assert waiting.count() == 16
    assert all("team quota has 0 free" in j.pending_reason for j in waiting)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_fifty_concurrent_submissions_across_five_teams_never_overshoot_a_quota(fleet_dirs):
    """Sharing on (fair share, one team that may borrow): the teams that may
    not borrow stop at their quota, the borrower only takes idle quota, and
    no GPU is promised twice."""
    cluster = memory_cluster(size=24, spares=0)  # 48 GPUs
    teams = [team_with_quota(cluster, name=f"team-{t}", gpus=8, max_running_jobs=20,
                             priority_weight=t + 1, can_borrow=t == 0) for t in range(5)]
    start = threading.Barrier(50)
    errors = []

    def submit_and_admit(i):
        try:
            job = submit(cluster, teams[i % 5], name=f"job-{i}", nodes=1, gpus=2)
            job.transition(Phase.QUEUED, reason="Queued")
            start.wait(timeout=60)
            admit(cluster.id, timezone.now())
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit_and_admit, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert errors == []
    admitted = TrainingJob.objects.filter(cluster=cluster, phase=Phase.ADMITTED)
    for team in teams[1:]:
        mine = admitted.filter(team=team)
        assert sum(j.world_size for j in mine) <= 8
        assert all(j.borrowed_gpus == 0 for j in mine)
    # Every other team asks for all of its quota: nothing of it is idle.
    borrower = admitted.filter(team=teams[0])
    assert sum(j.world_size for j in borrower) == 8
    assert sum(j.world_size for j in admitted) <= 48


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_concurrent_launches_never_place_a_node_twice(fleet_dirs):
    """Twelve admitted gangs of 2 nodes launched at once onto 16 free nodes
    (admitted past capacity on purpose, as a race between passes could):
    eight launch, four wait, and no node is in two live attempts."""
    from django.db.models import Count

    from jobs.models import AttemptNode, JobAttempt
    from jobs.reconcile import reconcile_job_unlocked

    cluster = memory_cluster(size=16, spares=0, preflight=False)
    team = team_with_quota(cluster, gpus=1000, max_running_jobs=100)
    jobs = []
    for i in range(12):
        job = submit(cluster, team, name=f"gang-{i}", nodes=2, gpus=2)
        job.transition(Phase.QUEUED, reason="Queued")
        job.transition(Phase.ADMITTED, reason="Admitted", pool=cluster.pools.get())
        jobs.append(job)
    start = threading.Barrier(len(jobs))
    errors = []

    def launch(job):
        try:
            start.wait(timeout=30)
            reconcile_job_unlocked(job.id, timezone.now())
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=launch, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)

    assert errors == []
    live = AttemptNode.objects.exclude(attempt__state__in=JobAttempt.ENDED)
    assert live.count() == 16
    doubled = live.values("node_id").annotate(n=Count("id")).filter(n__gt=1)
    assert list(doubled) == []
    assert TrainingJob.objects.filter(phase=Phase.STARTING).count() == 8
    assert TrainingJob.objects.filter(phase=Phase.QUEUED).count() == 4
