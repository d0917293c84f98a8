"""The "auto" checkpoint interval from measured costs and failure rates."""

import math

import pytest
from django.utils import timezone

from clusters.models import Node
from jobs.checkpointing import interval as ci
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    memory_cluster,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf():
    assert ci.young_daly_seconds(10.0, 3600.0) == pytest.approx(math.sqrt(72000.0))


def test_the_prior_gives_a_young_fleet_a_finite_mtbf(db):
    cluster = memory_cluster()
    assert ci.node_mtbf_s(cluster.id) == pytest.approx(ci.PRIOR_NODE_MTBF_S)


def test_measured_failures_pull_the_mtbf_down(db):
    cluster = memory_cluster()
    Node.objects.filter(cluster=cluster).update(ready_seconds=1000.0, failure_count=1)
    # 5 nodes: 5,000 ready seconds and 5 failures, plus one prior node-month and failure.
    assert ci.node_mtbf_s(cluster.id) == pytest.approx((5000 + ci.PRIOR_NODE_MTBF_S) / 6)


def test_the_job_gets_an_interval_in_steps_from_its_measurements(db):
    cluster = memory_cluster(observe_interval_s=1.0)
    team = team_with_quota(cluster)
    job = submit(cluster, team, checkpoint_policy="auto")
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    Node.objects.filter(cluster=cluster).update(ready_seconds=36000.0, failure_count=2)
    write_checkpoint(job, 10, attempt, blocking_s=2.0)
    heartbeat(attempt, 12, later(now, 1), step_time_s=0.5)
    reconcile_job_unlocked(job.id, later(now, 1))
    job.refresh_from_db()
    mtbf = (5 * 36000.0 + ci.PRIOR_NODE_MTBF_S) / 11 / 2
    inputs = job.checkpoint_interval_inputs
    assert inputs["cost_s"] == 2.0
    assert inputs["mtbf_s"] == pytest.approx(mtbf, rel=1e-2)
    assert inputs["step_time_s"] == 0.5
    expected_s = math.sqrt(2 * 2.0 * mtbf)
    assert inputs["interval_s"] == pytest.approx(expected_s, rel=1e-2)
    assert job.checkpoint_interval_steps == pytest.approx(expected_s / 0.5, rel=1e-2)
    assert attempt.directives()["checkpoint_interval_steps"] == job.checkpoint_interval_steps


def test_a_fixed_policy_is_left_alone(db):
    cluster = memory_cluster()
    team = team_with_quota(cluster)
    job = submit(cluster, team, checkpoint_policy="steps", checkpoint_every_steps=7)
    assert ci.refresh(job) is False
    job.refresh_from_db()
    assert job.checkpoint_interval_steps is None and job.effective_checkpoint_every == 7
