"""Checkpoint-then-preempt on real torchrun processes: a high-priority job
of the same team takes a running gang's nodes; the gang saves a checkpoint
on the stop directive, exits, requeues first in its team, and resumes from
that checkpoint with no step lost."""

import pytest

from jobs import tasks
from jobs.models import Phase, TrainingJob
from tests.e2e.conftest import TRAINER
from tests.e2e.test_failures_e2e import cancel_and_wait, refreshed, running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.mark.timeout(300)
def test_a_high_priority_job_preempts_a_gang_that_resumes_with_no_step_lost(fleet):
    cluster = fleet.cluster(spares=0, preemption_checkpoint_wait_s=60.0)
    low = fleet.submit(cluster, name="low", gpus=2, max_steps=2000, step_sleep_s=0.1)
    fleet.wait("the low job past its first checkpoint", running(low, 1, 7), job=low)
    high = TrainingJob.objects.create(
        name="high", team=low.team, cluster=cluster, num_nodes=2, gpus_per_node=1,
        priority=5, hyperparameters={**TRAINER, "max_steps": 4000, "step_sleep_s": 0.1},
        checkpoint_every_steps=5)
    tasks.reconcile_job.delay(high.id)
    fleet.wait("the low job preempted", lambda: low.events.filter(kind="Preempted").first(),
               job=low, timeout=120)
    preempted = low.events.get(kind="Preempted")
    assert preempted.evidence["by"] == high.id
    assert preempted.evidence["checkpoint_step"] is not None, fleet.story(low)
    assert preempted.evidence["steps_lost"] == 0
    assert high.events.filter(kind="MakingRoom").exists()
    fleet.wait("the high job running", running(high, 1, 1), job=high, timeout=120)
    assert refreshed(low).phase == Phase.QUEUED
    cancel_and_wait(fleet, high)
    second = fleet.wait("the low job running again", running(low, 2, 1), job=low, timeout=120)
    assert second.resume_step == preempted.evidence["checkpoint_step"]
    resumed = low.events.get(kind="ResumedFromCheckpoint")
    assert resumed.evidence["steps_lost"] == 0
    assert not low.goodput.filter(category="preemption").exists()
    assert refreshed(low).restart_counts == {}
    cancel_and_wait(fleet, low)
