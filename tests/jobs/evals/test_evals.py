"""Eval runs on spare capacity (jobs/evals/): the spec's eval block, one
run per picked checkpoint however often reconcile runs, admission below
every training job, preemption by training without touching it, results on
the parent's chart and timeline, retention and the goodput ledger."""

import time

import pytest
from django.utils import timezone

from clusters.models import NodePool
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs import evals
from jobs.admission import admit
from jobs.admission.sharing import EVICTING
from jobs.checkpointing import protected_steps
from jobs.metrics.series import series
from jobs.models import EVAL_PRIORITY, JobAttempt, Phase, TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from jobs.worker_api.tokens import issue as issue_token
from tests.api_factories import worker_client
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")

POLICY = {"every_n_checkpoints": 2, "pool": "spare", "nodes": 1, "gpus_per_node": 1}


@pytest.fixture
def cluster(db):
    """Pool "gpu" (2 nodes × 2 GPUs) for training, pool "spare" (1 node × 1
    GPU) where the eval runs go."""
    cluster = memory_cluster(size=2, spares=0)
    spare = NodePool.objects.create(cluster=cluster, name="spare", gpus_per_node=1, size=1,
                                    spare_count=0)
    provider_of(cluster).add_nodes(pool_info(spare), 1)
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    return cluster


@pytest.fixture
def vision(team):
    """conftest's team (4 GPUs on the cluster, 3 running jobs)."""
    return team


def running(job, now, step=10):
    launch(job, now)
    attempt = JobAttempt.objects.get(job=job)
    heartbeat(attempt, step, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.pending_reason
    return attempt


def parent_with_checkpoints(cluster, team, now, steps=(5, 10, 15, 20), policy=POLICY):
    job = submit(cluster, team, name="parent", nodes=1, gpus=2, eval_policy=policy,
                 pool=cluster.pools.get(name="gpu"))
    attempt = running(job, now)
    for step in steps:
        write_checkpoint(job, step, attempt)
    return job, attempt


def kinds(job):
    return list(job.events.values_list("kind", flat=True))


# --- the spec ----------------------------------------------------------------------------

URL = "/api/v1/jobs/"


def spec(**eval_block):
    return {"name": "gpt", "cluster": "mem-a", "num_nodes": 1, "gpus_per_node": 2,
            "hyperparameters": {"model": "nano", "max_steps": 20}, "eval": eval_block}


@pytest.mark.usefixtures("team")
class TestTheEvalBlock:
    def test_it_refuses_a_pool_the_cluster_lacks_naming_the_field(self, api, owner):
        resp = api(owner).post(URL, spec(every_checkpoint=True, pool="nope"), format="json")
        assert resp.status_code == 400, resp.content
        assert "unknown pool 'nope'" in resp.data["eval"]["pool"][0]
        assert not TrainingJob.objects.exists()

    def test_it_asks_which_checkpoints_to_evaluate(self, api, owner):
        resp = api(owner).post(URL, spec(pool="spare"), format="json")
        assert resp.status_code == 400
        assert "every_n_checkpoints" in resp.data["eval"]
        both = api(owner).post(URL, spec(pool="spare", every_checkpoint=True,
                                         every_n_checkpoints=2), format="json")
        assert "every_checkpoint" in both.data["eval"]

    @pytest.mark.parametrize("bad", [{"every_n_checkpoints": 0}, {"nodes": 9},
                                     {"gpus_per_node": 3}, {"colour": "red"},
                                     {"samples": "2"}])
    def test_it_refuses_a_bad_value_naming_it(self, api, owner, bad):
        block = {"every_n_checkpoints": 1, "pool": "spare", **bad}
        resp = api(owner).post(URL, spec(**block), format="json")
        assert resp.status_code == 400, resp.content
        assert next(iter(bad)) in resp.data["eval"]
        assert not TrainingJob.objects.exists()

    def test_a_program_of_its_own_must_name_its_eval_program(self, api, owner):
        body = {**spec(every_checkpoint=True, pool="spare"), "entrypoint": ["python", "t.py"],
                "hyperparameters": {}}
        resp = api(owner).post(URL, body, format="json")
        assert resp.status_code == 400
        assert "entrypoint" in resp.data["eval"]

    def test_it_keeps_the_block_as_the_job_eval_policy(self, api, owner):
        resp = api(owner).post(URL, spec(every_n_checkpoints=3, pool="spare", samples=1),
                               format="json")
        assert resp.status_code == 201, resp.content
        job = TrainingJob.objects.get()
        assert job.eval_policy == {"every_n_checkpoints": 3, "pool": "spare", "samples": 1,
                                   "nodes": 1, "gpus_per_node": 1}
        assert resp.data["eval"] == job.eval_policy and resp.data["kind"] == "train"


# --- making the runs ---------------------------------------------------------------------

def test_reconcile_run_twice_makes_one_eval_run_per_picked_checkpoint(cluster, vision):
    now = timezone.now()
    job, _ = parent_with_checkpoints(cluster, vision, now)
    reconcile_job_unlocked(job.id, later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 3))
    evals.schedule(job, later(now, 3))
    runs = list(TrainingJob.objects.filter(parent=job).order_by("eval_step"))
    # Every 2nd checkpoint: the 2nd (step 10) and the 4th (step 20).
    assert [r.eval_step for r in runs] == [10, 20]
    run = runs[0]
    assert (run.kind, run.pool.name, run.num_nodes, run.gpus_per_node) == ("eval", "spare", 1, 1)
    assert run.priority == EVAL_PRIORITY and run.team == job.team
    assert run.hyperparameters["mode"] == "eval" and run.completion == "exit"
    assert kinds(job).count("EvalScheduled") == 2
    # Each checkpoint was verified before it was evaluated.
    assert set(job.checkpoints.filter(step__in=(10, 20)).values_list("state", flat=True)) == {
        "verified"}


def test_every_checkpoint_leaves_out_emergency_saves(cluster, vision):
    now = timezone.now()
    job, attempt = parent_with_checkpoints(cluster, vision, now, steps=(5,),
                                           policy={**POLICY, "every_n_checkpoints": None,
                                                   "every_checkpoint": True})
    write_checkpoint(job, 7, attempt, emergency=True)
    reconcile_job_unlocked(job.id, later(now, 2))
    assert list(job.evals.values_list("eval_step", flat=True)) == [5]


def test_retention_keeps_a_checkpoint_a_live_eval_run_has_yet_to_read(cluster, vision):
    now = timezone.now()
    job, _ = parent_with_checkpoints(cluster, vision, now)
    reconcile_job_unlocked(job.id, later(now, 2))
    assert {10, 20} <= protected_steps(job)
    TrainingJob.objects.filter(parent=job, eval_step=10).update(phase=Phase.SUCCEEDED)
    assert 10 not in protected_steps(job)


# --- admission and preemption ------------------------------------------------------------

def eval_run(job, step):
    return TrainingJob.objects.get(parent=job, eval_step=step)


def test_an_eval_run_is_admitted_after_any_training_job_of_its_team(cluster, vision):
    now = timezone.now()
    job, _ = parent_with_checkpoints(cluster, vision, now, steps=(5, 10))
    reconcile_job_unlocked(job.id, later(now, 2))
    run = eval_run(job, 10)
    reconcile_job_unlocked(run.id, later(now, 3))  # queued
    # Submitted after the eval run, at the lowest priority a person may give.
    low = submit(cluster, vision, name="low", nodes=1, gpus=1, priority=-1000,
                 pool=cluster.pools.get(name="spare"))
    reconcile_job_unlocked(low.id, later(now, 4))
    report = admit(cluster.id, later(now, 5))
    assert report.admitted == [low.id]
    run.refresh_from_db()
    assert run.phase == Phase.QUEUED and "pool spare" in run.pending_reason


def running_eval(job, now, step=10):
    run = eval_run(job, step)
    reconcile_job_unlocked(run.id, now)
    admit(run.cluster_id, now)
    reconcile_job_unlocked(run.id, now)
    attempt = JobAttempt.objects.get(job=run)
    heartbeat(attempt, step, later(now, 1))
    reconcile_job_unlocked(run.id, later(now, 1))
    run.refresh_from_db()
    assert run.phase == Phase.RUNNING, run.pending_reason
    return run, attempt


def test_a_training_job_short_of_nodes_stops_an_eval_run_at_once_and_training_is_untouched(
        cluster, vision):
    now = timezone.now()
    job, parent_attempt = parent_with_checkpoints(cluster, vision, now, steps=(5, 10))
    reconcile_job_unlocked(job.id, later(now, 2))
    run, attempt = running_eval(job, later(now, 3))
    assert attempt.resume_step == 10
    assert attempt.provider_ref and provider_of(cluster).attempt(attempt.provider_ref)
    # Another team's training job wants the spare pool's one node.
    speech = team_with_quota(cluster, name="speech", gpus=4)
    waiter = submit(cluster, speech, name="waiter", nodes=1, gpus=1,
                    pool=cluster.pools.get(name="spare"))
    reconcile_job_unlocked(waiter.id, later(now, 5))
    admit(cluster.id, later(now, 6))
    run.refresh_from_db()
    evicting = next(c for c in run.conditions if c["type"] == EVICTING)
    assert evicting["by"] == waiter.id and evicting["wait_s"] == 0.0
    # Nothing to checkpoint: its next pass stops it and sends it back.
    reconcile_job_unlocked(run.id, later(now, 6))
    run.refresh_from_db()
    assert run.phase == Phase.QUEUED and "Preempted" in kinds(run)
    assert JobAttempt.objects.get(job=run).state == "stopped"
    admit(cluster.id, later(now, 7))
    waiter.refresh_from_db()
    assert waiter.phase == Phase.ADMITTED
    # The parent heard of it and trained on.
    job.refresh_from_db()
    assert "EvalPreempted" in kinds(job)
    assert job.phase == Phase.RUNNING and job.attempts.count() == 1
    parent_attempt.refresh_from_db()
    assert parent_attempt.state == "running"
    # The eval run's GPU time is booked as eval, never as training's.
    assert set(run.goodput.exclude(category="queued").values_list("category", flat=True)) \
        == {"eval"}


def test_an_eval_run_preempts_nobody(cluster, vision):
    now = timezone.now()
    blocker = submit(cluster, vision, name="blocker", nodes=1, gpus=1, priority=-1000,
                     pool=cluster.pools.get(name="spare"))
    running(blocker, now, step=3)
    job, _ = parent_with_checkpoints(cluster, vision, later(now, 2), steps=(5, 10))
    reconcile_job_unlocked(job.id, later(now, 4))
    run = eval_run(job, 10)
    reconcile_job_unlocked(run.id, later(now, 5))
    admit(cluster.id, later(now, 6))
    blocker.refresh_from_db()
    assert not any(c["type"] == EVICTING for c in blocker.conditions)
    run.refresh_from_db()
    assert run.phase == Phase.QUEUED


# --- results -----------------------------------------------------------------------------

def report(attempt, step, val_loss):
    """What the eval mode sends over the worker API, with the run's own token."""
    client = worker_client(issue_token(attempt))
    url = f"/api/v1/worker/attempts/{attempt.pk}"
    points = [{"rank": 0, "name": "val_loss", "step": step, "value": val_loss,
               "time": time.time()},
              {"rank": 0, "name": "val_perplexity", "step": step, "value": 2.0 ** val_loss,
               "time": time.time()}]
    resp = client.post(f"{url}/metrics", {"batch_id": "eval-1", "points": points},
                       format="json")
    assert resp.status_code in (200, 201), resp.content
    resp = client.post(f"{url}/events", {"kind": "evaluated", "rank": 0, "data": {
        "step": step, "val_loss": val_loss,
        "samples": [{"prompt": "To be", "completion": " or not"}]}}, format="json")
    assert resp.status_code == 201, resp.content


def test_a_finished_eval_run_puts_val_loss_on_the_parent_chart_at_its_step(
        cluster, vision, api, owner, outsider):
    now = timezone.now()
    job, _ = parent_with_checkpoints(cluster, vision, now, steps=(5, 10))
    reconcile_job_unlocked(job.id, later(now, 2))
    run, attempt = running_eval(job, later(now, 3))
    report(attempt, 10, 1.5)
    provider = provider_of(cluster)
    for name in attempt.placements.values_list("node__name", flat=True):
        provider.exit_node(attempt.provider_ref, name, exit_code=0)
    reconcile_job_unlocked(run.id, later(now, 5))
    run.refresh_from_db()
    assert run.phase == Phase.SUCCEEDED
    assert run.eval_result["metrics"] == {"val_loss": 1.5, "val_perplexity": 2.0 ** 1.5}
    assert run.eval_result["samples"] == [{"prompt": "To be", "completion": " or not"}]
    assert series(job.id, "val_loss")["points"] == [[10, 1.5]]
    finished = job.events.get(kind="EvalFinished")
    assert finished.evidence["val_loss"] == 1.5 and "val_loss 1.5000" in finished.message
    assert kinds(job).index("EvalScheduled") < kinds(job).index("EvalStarted") \
        < kinds(job).index("EvalFinished")
    # Through the API: the chart's names and series, and the runs, team-scoped.
    names = api(owner).get(f"/api/v1/jobs/{job.id}/metrics/names/")
    assert "val_loss" in names.data["names"]
    chart = api(owner).get(f"/api/v1/jobs/{job.id}/metrics/", {"name": "val_loss"})
    assert chart.data["points"] == [[10, 1.5]]
    listed = api(owner).get(f"/api/v1/jobs/{job.id}/evals/")
    assert listed.status_code == 200
    assert [(e["eval_step"], e["phase"], e["metrics"]["val_loss"]) for e in listed.data] == [
        (10, "succeeded", 1.5)]
    assert listed.data[0]["samples"][0]["completion"] == " or not"
    assert api(outsider).get(f"/api/v1/jobs/{job.id}/evals/").status_code == 404
    goodput = api(owner).get(f"/api/v1/jobs/{job.id}/goodput/").data
    assert goodput["categories"]["eval"]["gpu_seconds"] == 0.0
    assert goodput["eval_runs"]["gpu_seconds"] > 0.0


def test_cancelling_the_parent_cancels_its_eval_runs_not_yet_done(cluster, vision):
    now = timezone.now()
    job, _ = parent_with_checkpoints(cluster, vision, now, steps=(5, 10))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.request_cancel("user:olivia", now=later(now, 3))
    reconcile_job_unlocked(job.id, later(now, 3))
    assert eval_run(job, 10).phase == Phase.CANCELLED
