"""The goodput ledger: categories booked once, GPU-seconds, restart latency."""

import pytest
from django.utils import timezone

from jobs import goodput
from jobs.models import GoodputEntry
from jobs.reconcile import reconcile_job
from tests.fleet_helpers import (
    heartbeat,
    later,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
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
    reconcile_job(job.id, now)
    first = job.attempts.get()
    heartbeat(first, 3, later(now, 1))
    reconcile_job(job.id, later(now, 1))
    provider_of(cluster).exit_node(first.provider_ref, nodes_of(first)[0].name, signal=9)
    reconcile_job(job.id, later(now, 10))  # failure detected and relaunched at +10 s
    second = job.attempts.get(number=2)
    heartbeat(second, 1, later(now, 16))
    reconcile_job(job.id, later(now, 16))
    reconcile_job(job.id, later(now, 17))
    restart = GoodputEntry.objects.get(job=job, category="restart")
    assert restart.seconds == pytest.approx(6.0)
    assert restart.gpu_seconds == pytest.approx(24.0)
    summary = goodput.summarize(job.goodput.all())
    assert summary["categories"]["restart"]["seconds"] == pytest.approx(6.0)
    # 9 s from the first step to the failure, none of it saved by a checkpoint.
    assert summary["categories"]["rollback"]["seconds"] == pytest.approx(9.0)
    assert summary["categories"]["productive"]["seconds"] == pytest.approx(0.0)
