"""20 submissions admitted at once never overshoot a quota: real threads,
each with its own database connection, against PostgreSQL when DATABASE_URL
points there (row locks) and SQLite otherwise (IMMEDIATE transactions)."""

import threading

import pytest
from django.db import connection
from django.utils import timezone

from jobs.models import Phase, TrainingJob
from jobs.scheduling import admit
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
