"""Eval runs on a second pool, on real torchrun processes reporting over real
HTTP: each checkpoint's eval run puts `val_loss` on the parent's chart at
its step while the parent trains on; a killed eval rank restarts the eval
run (on the pool's spare) and leaves training untouched."""

import pytest

from clusters.models import NodePool
from clusters.reconcile import reconcile_cluster_unlocked
from jobs import tasks
from jobs.metrics.series import series
from jobs.models import JobAttempt, Phase, Quota, Team, TrainingJob

from .conftest import TRAINER

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def refreshed(obj):
    obj.refresh_from_db()
    return obj


def eval_run(parent, step):
    return TrainingJob.objects.filter(parent=parent, eval_step=step).first()


@pytest.mark.timeout(420)
def test_eval_runs_on_a_second_pool_chart_val_loss_while_training_runs_and_a_killed_one_restarts(
        fleet):
    cluster = fleet.cluster(size=1, spares=0)  # pool "cpu": the training node
    NodePool.objects.create(cluster=cluster, name="eval", gpus_per_node=1, size=1, spare_count=1)
    reconcile_cluster_unlocked(cluster.id)
    team = Team.objects.create(name="vision")
    Quota.objects.create(team=team, cluster=cluster, gpus=4)
    # Long enough to outlive the test (it is cancelled at the end); slowed so
    # that each eval run's held-out batches take seconds, a window to kill it.
    parent = TrainingJob.objects.create(
        name="train", team=team, cluster=cluster, pool=cluster.pools.get(name="cpu"),
        num_nodes=1, gpus_per_node=1, checkpoint_every_steps=40, keep_last=2,
        hyperparameters={**TRAINER, "max_steps": 5000, "step_sleep_s": 0.1},
        eval_policy={"every_checkpoint": True, "pool": "eval", "nodes": 1, "gpus_per_node": 1,
                     "max_batches": 40, "samples": 1, "sample_tokens": 8})
    tasks.reconcile_job.delay(parent.id)

    first = fleet.wait("the eval run of step 40 succeeded", lambda: (
        (run := eval_run(parent, 40)) is not None and refreshed(run).phase == Phase.SUCCEEDED
        and run), job=parent, timeout=200)
    # On the parent's chart at the checkpoint's step, while it trains on.
    points = dict(map(tuple, series(parent.id, "val_loss")["points"]))
    assert 0 < points[40] == first.eval_result["metrics"]["val_loss"]
    assert refreshed(parent).phase == Phase.RUNNING
    assert first.pool.name == "eval" and first.eval_result["samples"][0]["completion"]
    assert first.eval_result["metrics"]["val_perplexity"] > 1

    # Kill the next eval run's rank while it evaluates.
    second = fleet.wait("the eval run of step 80 evaluating", lambda: (
        (run := eval_run(parent, 80)) is not None
        and JobAttempt.objects.filter(job=run, number=1, state="running").first()),
        job=parent, timeout=120)
    fleet.provider(cluster).kill_rank(second.provider_ref, rank=0)
    run = eval_run(parent, 80)
    fleet.wait("the killed eval run redone", lambda: refreshed(run).phase == Phase.SUCCEEDED,
               job=run, timeout=150)
    assert run.attempts.count() == 2
    # One rank killed on a healthy node: a rank's death, not the node's
    # (jobs/recovery/evidence.py), redone in place.
    assert run.attempts.get(number=1).failure_class == "process"
    assert run.eval_result["attempt"] == 2
    assert 80 in dict(map(tuple, series(parent.id, "val_loss")["points"]))

    # Training never noticed: one attempt, no restarts, still running.
    parent.refresh_from_db()
    assert parent.phase == Phase.RUNNING
    assert parent.attempts.count() == 1 and not parent.restart_counts
    kinds = list(parent.events.values_list("kind", flat=True))
    assert {"EvalScheduled", "EvalStarted", "EvalRestarted", "EvalFinished"} <= set(kinds)
    restarted = parent.events.get(kind="EvalRestarted", evidence__eval_job=run.pk)
    assert restarted.evidence["failure_class"] == "process"
    # Eval GPU time is the eval runs' own, never the parent's.
    assert not parent.goodput.filter(category="eval").exists()
    assert set(run.goodput.exclude(category="queued").values_list("category", flat=True)) \
        == {"eval"}

    parent.request_cancel("test")
    tasks.reconcile_job.delay(parent.id)
    fleet.wait("the parent and its eval runs ended", lambda: refreshed(parent).is_terminal and
               not TrainingJob.objects.filter(parent=parent).exclude(
                   phase__in=TrainingJob.TERMINAL).exists(), job=parent, timeout=90)
