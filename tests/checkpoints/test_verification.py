"""Verification, registration from storage, export and the retention sweep,
on real checkpoint folders (DCP shards, manifest, commit marker)."""

from pathlib import Path

import pytest
import torch
from django.utils import timezone

from checkpoints.export import export_final
from checkpoints.models import Checkpoint, ModelArtifact
from checkpoints.verification import register_from_storage
from jobs.checkpointing import newest_verified, open_job_storage, sweep_retention
from tests.fleet_helpers import memory_cluster, submit, team_with_quota, write_checkpoint

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def job_keeping_two(db):
    """On the in-memory fleet, keeping its last two checkpoints."""
    cluster = memory_cluster()
    return submit(cluster, team_with_quota(cluster), keep_last=2)


def folder(checkpoint) -> Path:
    return Path(checkpoint.uri.removeprefix("file://"))


def test_the_newest_checkpoint_that_verifies_is_chosen_and_marked(job_keeping_two):
    write_checkpoint(job_keeping_two, 5)
    newest = write_checkpoint(job_keeping_two, 10)
    assert newest_verified(job_keeping_two, timezone.now()).step == 10
    newest.refresh_from_db()
    assert newest.state == Checkpoint.State.VERIFIED and newest.verified_at is not None


def test_a_checkpoint_without_its_commit_marker_is_skipped(job_keeping_two):
    write_checkpoint(job_keeping_two, 5)
    unfinished = write_checkpoint(job_keeping_two, 10)
    (folder(unfinished) / "COMMITTED").unlink()
    assert newest_verified(job_keeping_two, timezone.now()).step == 5
    unfinished.refresh_from_db()
    assert unfinished.state == Checkpoint.State.CORRUPT
    assert "COMMITTED" in unfinished.state_reason
    assert job_keeping_two.events.filter(kind="CheckpointCorrupt").count() == 1


def test_a_committed_folder_never_reported_is_registered(job_keeping_two):
    lost = write_checkpoint(job_keeping_two, 15)
    Checkpoint.objects.filter(pk=lost.pk).delete()  # the report died with its rank
    made = register_from_storage(job_keeping_two, open_job_storage(job_keeping_two))
    assert [c.step for c in made] == [15]
    assert made[0].state == Checkpoint.State.COMMITTED and made[0].bytes > 0
    assert register_from_storage(job_keeping_two, open_job_storage(job_keeping_two)) == []


def test_the_export_keeps_the_model_weights_with_their_checksum(job_keeping_two):
    checkpoint = write_checkpoint(job_keeping_two, 20, weight=torch.arange(4.0).reshape(2, 2))
    storage = open_job_storage(job_keeping_two)
    artifact = export_final(job_keeping_two, checkpoint, storage, timezone.now())
    assert torch.equal(torch.load(artifact.uri, weights_only=False)["w"],
                       torch.arange(4.0).reshape(2, 2))
    assert Path(artifact.uri).with_name("config.json").exists()
    assert artifact.config == {"model": "nano"}
    assert export_final(job_keeping_two, checkpoint, open_job_storage(job_keeping_two),
                        timezone.now()) == artifact
    assert ModelArtifact.objects.count() == 1


def test_the_retention_sweep_keeps_the_newest_and_deletes_the_rest(job_keeping_two):
    rows = [write_checkpoint(job_keeping_two, step) for step in (5, 10, 15, 20)]
    assert sweep_retention(timezone.now()) == 2
    states = {c.step: c.state for c in Checkpoint.objects.filter(job=job_keeping_two)}
    assert states == {5: "deleted", 10: "deleted", 15: "committed", 20: "committed"}
    assert not folder(rows[0]).exists() and folder(rows[3]).exists()

