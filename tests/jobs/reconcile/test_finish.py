"""A job succeeds only with its final step's checkpoint verified and
exported; ranks that exit 0 without it are a failure with evidence, and the
job redoes the missing steps from its newest verified checkpoint."""

import shutil
from pathlib import Path

import pytest
import torch
from django.utils import timezone

from checkpoints.models import Checkpoint, ModelArtifact
from jobs.models import JobAttempt, JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    kinds,
    later,
    launch,
    memory_cluster,
    provider_of,
    submit,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster()


def ran_to_the_end(mem_cluster, job, now, final=True):
    """Attempt 1 trains to step 20 (max_steps) and every rank exits 0."""
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 1, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    write_checkpoint(job, 10, attempt, created_at=later(now, 5))
    if final:
        write_checkpoint(job, 20, attempt, created_at=later(now, 9))
    heartbeat(attempt, 20, later(now, 9))
    provider_of(mem_cluster).finish(attempt.provider_ref)
    return attempt


def test_ranks_that_exit_0_without_the_final_checkpoint_do_not_succeed(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    attempt = ran_to_the_end(mem_cluster, job, now, final=False)
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.RESTARTING
    assert not ModelArtifact.objects.filter(job=job).exists()
    assert attempt.state == JobAttempt.State.FAILED and attempt.failure_class == "transient"
    assert job.restart_counts == {"transient": 1}
    assert job.current_step == 20  # the progress made is not wound back
    missing = JobEvent.objects.get(job=job, kind="FinalCheckpointMissing")
    assert missing.evidence["final_step"] == 20
    assert missing.evidence["newest_verified_step"] == 10
    assert "no checkpoint of step 20" in missing.message
    assert kinds(job)[-2:] == ["FinalCheckpointMissing", "Restarting"]
    assert "Succeeded" not in kinds(job)

    # After the backoff, the job redoes steps 11-20 from step 10, then succeeds.
    reconcile_job_unlocked(job.id, later(now, 13))
    second = job.attempts.get(number=2)
    assert second.resume_step == 10
    heartbeat(second, 11, later(now, 14))
    reconcile_job_unlocked(job.id, later(now, 14))
    write_checkpoint(job, 20, second, created_at=later(now, 18),
                     weight=torch.full((2, 2), 42.0))
    heartbeat(second, 20, later(now, 18))
    provider_of(mem_cluster).finish(second.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 19))
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED and job.current_step == 20
    artifact = ModelArtifact.objects.get(job=job)
    assert artifact.checkpoint.step == 20
    assert torch.equal(torch.load(artifact.uri, weights_only=False)["w"],
                       torch.full((2, 2), 42.0))


def test_a_corrupt_final_checkpoint_is_never_exported_in_place_of_the_final_model(
        mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    ran_to_the_end(mem_cluster, job, now)
    final = Checkpoint.objects.get(job=job, step=20)
    shard = next(Path(final.uri.removeprefix("file://")).glob("*.distcp"))
    shard.write_bytes(b"garbage")
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    final.refresh_from_db()
    assert final.state == Checkpoint.State.CORRUPT
    assert job.phase == Phase.RESTARTING
    assert job.current_step == 20
    assert not ModelArtifact.objects.filter(job=job).exists()
    missing = JobEvent.objects.get(job=job, kind="FinalCheckpointMissing")
    assert "failed verification" in missing.message
    assert [u["step"] for u in missing.evidence["unusable"]] == [20]
    assert missing.evidence["unusable"][0]["state"] == "corrupt"
    order = kinds(job)
    assert order.index("CheckpointCorrupt") < order.index("FinalCheckpointMissing")
    reconcile_job_unlocked(job.id, later(now, 13))
    assert job.attempts.get(number=2).resume_step == 10


def test_a_final_checkpoint_that_never_comes_fails_the_job_once_the_budget_is_spent(
        mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team, restart_budgets={"code": 0, "transient": 0, "hardware": 5,
                                                 "preempted": 10, "hang": 3})
    now = timezone.now()
    ran_to_the_end(mem_cluster, job, now, final=False)
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert "'transient' restart budget" in job.last_error
    assert "no checkpoint of step 20" in job.last_error
    assert not ModelArtifact.objects.filter(job=job).exists()
    assert kinds(job)[-3:] == ["FinalCheckpointMissing", "Failed", "NodesReleased"]


def test_it_succeeds_with_the_final_step_s_checkpoint_exported(mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    ran_to_the_end(mem_cluster, job, now)
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert ModelArtifact.objects.get(job=job).checkpoint.step == 20
    exported = JobEvent.objects.get(job=job, kind="ModelExported")
    assert exported.evidence["step"] == 20


def test_ranks_that_finished_long_before_the_pass_succeed_not_hang(mem_cluster, mem_team):
    """The chaos run's "finished attempt read as a hang": the worker holding
    the job's reconcile was killed as the ranks exited 0, and the next pass
    came after the heartbeat deadline (the lock's lifetime)."""
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    ran_to_the_end(mem_cluster, job, now)  # last heartbeat at +9 s
    reconcile_job_unlocked(job.id, later(now, 9 + 120))  # deadline 30 s, long gone
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert not job.events.filter(kind__in=["Restarting", "NodeFailed"]).exists()


def strip_export(job, step: int) -> None:
    """step-N as an emergency save leaves it: no `export/` model."""
    from regatta import manifest as mf

    final = Checkpoint.objects.get(job=job, step=step)
    root = Path(final.uri.removeprefix("file://"))
    shutil.rmtree(root / "export")
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.name not in (mf.MANIFEST, mf.MARKER))
    manifest = mf.build_manifest(step, mf.hash_local_files(root, rels))
    (root / mf.MANIFEST).write_bytes(manifest)
    (root / mf.MARKER).write_bytes(mf.marker_for(manifest))
    Checkpoint.objects.filter(pk=final.pk).update(manifest_sha256=mf.sha256_bytes(manifest),
                                                  emergency=True)


def test_a_final_checkpoint_without_the_model_is_resumed_to_export_it_never_shipped_raw(
        mem_cluster, mem_team):
    job = submit(mem_cluster, mem_team)
    now = timezone.now()
    ran_to_the_end(mem_cluster, job, now)
    strip_export(job, 20)

    reconcile_job_unlocked(job.id, later(now, 10))

    job.refresh_from_db()
    assert job.phase in (Phase.RESTARTING, Phase.STARTING), kinds(job)
    assert not ModelArtifact.objects.filter(job=job).exists()
    missing = JobEvent.objects.get(job=job, kind="FinalModelMissing")
    assert missing.evidence["step"] == 20 and missing.evidence["emergency"] is True
    reconcile_job_unlocked(job.id, later(now, 13))
    second = job.attempts.get(number=2)
    assert second.resume_step == 20
    # The resumed trainer finishes at once and saves step 20 again (into a
    # cleared folder), with its model.
    stale = Checkpoint.objects.get(job=job, step=20)
    shutil.rmtree(stale.uri.removeprefix("file://"))
    stale.delete()
    write_checkpoint(job, 20, second, created_at=later(now, 20))
    provider_of(mem_cluster).finish(second.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 25))

    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, kinds(job)
    artifact = ModelArtifact.objects.get(job=job)
    assert artifact.format == "torch" and artifact.checkpoint.step == 20
