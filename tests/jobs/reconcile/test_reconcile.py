"""The job reconciler's state machine on the in-memory provider (no process
can be started in these unit tests; tests/e2e runs the same paths with torchrun)."""

import json

import pytest
from django.utils import timezone

from checkpoints.models import ModelArtifact
from clusters.models import Node
from jobs.goodput.models import GoodputEntry
from jobs.models import AttemptNode, JobAttempt, JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from jobs.worker_api.tokens import issue as issue_token
from tests.api_factories import worker_client
from tests.fleet_helpers import (
    heartbeat,
    kinds,
    later,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)
from tests.fleet_helpers import (
    launch as fleet_launch,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster()


def launch(job, now):
    fleet_launch(job, now)
    job.refresh_from_db()
    return job.attempts.get()


def test_it_takes_a_job_from_pending_to_starting_with_a_launched_gang(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team,
                 hyperparameters={"model": "nano", "max_steps": 20, "lr": 0.01})
    now = timezone.now()
    attempt = launch(job, now)
    assert job.phase == Phase.STARTING
    assert attempt.state == JobAttempt.State.STARTING
    assert attempt.preflight["ok"] is True
    assert AttemptNode.objects.filter(attempt=attempt).count() == 2
    request = provider_of(mem_cluster).attempt(attempt.provider_ref).request
    env = request.env
    assert env["REGATTA_JOB_ID"] == str(job.id)
    assert env["REGATTA_ATTEMPT_ID"] == str(attempt.id)
    assert env["REGATTA_RESUME_STEP"] == "none"
    assert env["REGATTA_CHECKPOINT_URI"].endswith(f"job-{job.id}")
    assert json.loads(env["REGATTA_CONFIG"]) == {
        "model": "nano", "max_steps": 20, "lr": 0.01, "strategy": "ddp",
        "checkpoint_every_steps": 100, "keep_last": 3,
    }
    # Only the token's hash is kept.
    from jobs.models import hash_token

    assert attempt.token_hash == hash_token(env["REGATTA_TOKEN"])
    assert kinds(job) == ["Queued", "Admitted", "PreflightPassed", "Launched"]


def test_every_pass_hands_an_attempt_the_same_worker_token(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    attempt = launch(job, timezone.now())
    held = provider_of(mem_cluster).attempt(attempt.provider_ref).request.env["REGATTA_TOKEN"]

    # What a pass that re-runs the launch (its predecessor died after the
    # provider started the ranks) hands the provider, which keeps those ranks.
    again = issue_token(attempt)

    assert again == held
    reply = worker_client(held).post(f"/api/v1/worker/attempts/{attempt.pk}/heartbeat",
                                     {"rank": 0, "node": "n", "step": 1}, format="json")
    assert reply.status_code == 200, reply.content
    other = JobAttempt.objects.create(job=job, number=2, state=JobAttempt.State.STOPPED)
    assert issue_token(other) != held


def test_it_moves_to_running_on_the_first_heartbeat_with_a_step(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    attempt = launch(job, now)
    reconcile_job_unlocked(job.id, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    heartbeat(attempt, 3, later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.RUNNING
    assert job.current_step == 3
    assert attempt.state == JobAttempt.State.RUNNING


def test_running_it_twice_changes_nothing_more_than_once(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    fleet_launch(job, now)
    reconcile_job_unlocked(job.id, now)
    assert job.attempts.count() == 1
    assert len(provider_of(mem_cluster).fleet.attempts) == 1
    events = JobEvent.objects.filter(job=job).count()
    reconcile_job_unlocked(job.id, now)
    assert JobEvent.objects.filter(job=job).count() == events


def test_it_finishes_a_job_exports_the_model_and_releases_the_nodes(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    attempt = launch(job, now)
    heartbeat(attempt, 1, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    write_checkpoint(job, 20, attempt, created_at=later(now, 9))
    heartbeat(attempt, 20, later(now, 9))
    provider_of(mem_cluster).finish(attempt.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert job.current_step == 20
    artifact = ModelArtifact.objects.get(job=job)
    import torch

    weights = torch.load(artifact.uri, weights_only=False)
    assert torch.equal(weights["w"], torch.full((2, 2), 20.0))
    assert artifact.sha256 and artifact.bytes > 0
    assert kinds(job)[-3:] == ["ModelExported", "Succeeded", "NodesReleased"]
    assert not AttemptNode.objects.exclude(attempt__state__in=JobAttempt.ENDED).exists()
    # First step at +1 s, end at +10 s, less the checkpoint's 0.05 s stall.
    assert GoodputEntry.objects.get(job=job, category="productive").seconds == pytest.approx(8.95)
    assert GoodputEntry.objects.get(job=job, category="checkpoint").seconds == pytest.approx(0.05)


def test_a_job_never_ends_without_its_release_on_the_timeline(mem_cluster, mem_team,
                                                             monkeypatch):
    """The phase and the NodesReleased event commit together (Ctx.release_nodes):
    where the event cannot be written, the job is not moved either, so no
    reader sees it ended with its nodes held, and the next pass does both."""
    from django.db import DatabaseError

    from jobs.context import Ctx
    from jobs.models import TrainingJob

    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    attempt = launch(job, now)
    record = TrainingJob.record

    def refused(self, kind, *args, **kwargs):
        if kind == "NodesReleased":
            raise DatabaseError("the disk is full")
        return record(self, kind, *args, **kwargs)

    monkeypatch.setattr(TrainingJob, "record", refused)
    job.refresh_from_db()
    with pytest.raises(DatabaseError):
        Ctx(job, later(now, 1)).release_nodes(Phase.CANCELLED, attempt, reason="Cancelled")
    job.refresh_from_db()
    assert job.phase == Phase.STARTING and "Cancelled" not in kinds(job)

    monkeypatch.setattr(TrainingJob, "record", record)
    Ctx(job, later(now, 2)).release_nodes(Phase.CANCELLED, attempt, reason="Cancelled")
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED and kinds(job)[-2:] == ["Cancelled", "NodesReleased"]


def test_a_cancel_stops_the_ranks_and_releases_the_nodes(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    attempt = launch(job, now)
    job.request_cancel("olivia", now=later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.CANCELLED
    assert attempt.state == JobAttempt.State.STOPPED
    assert ("stop", attempt.provider_ref["name"]) in provider_of(mem_cluster).fleet.calls
    assert kinds(job)[-2:] == ["Cancelled", "NodesReleased"]


def test_a_node_that_fails_preflight_is_cordoned_and_the_job_starts_on_another(mem_cluster,
                                                                               mem_team):
    free = list(Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name"))
    provider_of(mem_cluster).fail_preflight(free[0].name)
    job = submit(mem_cluster, mem_team)
    attempt = launch(job, timezone.now())
    bad = Node.objects.get(pk=free[0].pk)
    assert bad.state == Node.State.CORDONED
    health = bad.health_events.get()
    assert health.kind == "nccl_test"
    assert health.evidence["preflight"] == {"ok": False, "check": "allreduce",
                                            "error": "collective test failed"}
    assert bad.events.filter(to_state="cordoned").exists()
    used = {p.node.name for p in attempt.placements.select_related("node")}
    assert bad.name not in used and len(used) == 2
    assert job.phase == Phase.STARTING
    assert "PreflightFailed" in kinds(job) and "NodeSwapped" in kinds(job)
    passed = job.events.get(kind="PreflightPassed")
    assert passed.evidence["allreduce_gbps"] == 10.0


def test_a_job_goes_back_to_the_queue_when_no_node_can_replace_a_failed_preflight(db):
    mem_cluster = memory_cluster(name="mem-small", size=2, spares=0)
    team = team_with_quota(mem_cluster)
    # One node of the two fails (both failing alike would blame the check).
    provider_of(mem_cluster).fail_preflight(
        Node.objects.filter(cluster=mem_cluster).order_by("name").first().name)
    Node.objects.filter(cluster=mem_cluster).update(preflight_passed_at=None)
    job = submit(mem_cluster, team)
    launch(job, timezone.now())
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED
    assert job.pending_reason.startswith("preflight failed on")
    assert job.attempts.get().state == JobAttempt.State.FAILED


def test_preflight_is_skipped_when_the_cluster_turns_it_off(db):
    mem_cluster = memory_cluster(name="mem-nopf", preflight=False)
    team = team_with_quota(mem_cluster)
    job = submit(mem_cluster, team)
    attempt = launch(job, timezone.now())
    assert attempt.preflight == {}
    assert not [c for c in provider_of(mem_cluster).fleet.calls if c[0] == "preflight"]
