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
    # A DDP job of the trainer, no failure yet: the prior's one rollback in
    # two failures (the other handed over by the survivors).
    assert inputs["rollback_share"] == 0.5
    expected_s = math.sqrt(2 * 2.0 * mtbf / 0.5)
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


def _attempts(job, *rows):
    """Attempts 1.. with (failure class, last step reported, resumed from)."""
    from jobs.models import JobAttempt

    for number, (failure, last_step, resumed) in enumerate(rows, start=1):
        JobAttempt.objects.create(job=job, number=number, state="failed" if failure else "running",
                                  failure_class=failure or "", last_step=last_step,
                                  resume_step=resumed)


def test_failures_the_survivors_handed_over_lengthen_the_interval(db):
    """A resume at most one step behind the last reported step was a
    hand-over: the checkpoints insure only against the rest."""
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster), checkpoint_policy="auto")
    assert ci.rollback_share(job) == 0.5, "the prior: one rollback, one hand-over"

    _attempts(job, ("hardware", 120, None), ("process", 300, 120), ("transient", 305, 299),
              ("preempted", 400, 305), (None, 410, 400))
    # Three hand-overs (120 -> 120, 300 -> 299, 305 -> 305) beside the
    # prior's one of each; the preemption is not counted.
    assert ci.rollback_share(job) == pytest.approx(1 / 5)

    mtbf = ci.node_mtbf_s(cluster.id) / job.num_nodes
    assert ci.compute(job)["interval_s"] == pytest.approx(
        math.sqrt(2 * ci.DEFAULT_COST_S * mtbf * 5), rel=1e-2)


def test_failures_that_rolled_back_bring_the_interval_back(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster), checkpoint_policy="auto")
    _attempts(job, ("hang", 120, None), ("hardware", 300, 100), (None, 305, 250))
    # Both lost more than a step: three rollbacks (one the prior's) in four.
    assert ci.rollback_share(job) == pytest.approx(3 / 4)


def test_a_job_that_cannot_hand_over_starts_at_every_failure_rolling_back(db):
    cluster = memory_cluster()
    team = team_with_quota(cluster)
    fsdp = submit(cluster, team, checkpoint_policy="auto", strategy="fsdp")
    own = submit(cluster, team, checkpoint_policy="auto", entrypoint=["train.py"])
    assert ci.rollback_share(fsdp) == 1.0
    assert ci.rollback_share(own) == 1.0
    # A program of the team's own that hands over (the SDK's checkpointer)
    # earns the longer interval from its restarts.
    _attempts(own, ("hardware", 50, None), ("hardware", 90, 50), (None, 95, 90))
    assert ci.rollback_share(own) == pytest.approx(1 / 3)
