"""A symbolic link planted in a team's storage after submission (team A's
job folder replaced by a link to team B's) must not hand A's download B's
weights, nor let retention register and delete B's steps."""

import hashlib
import os
import shutil

import pytest
import torch
from django.utils import timezone

from checkpoints.models import Checkpoint
from jobs import checkpointing
from tests.api_factories import make_job
from tests.fleet_helpers import write_checkpoint

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def root(settings, tmp_path):
    root = tmp_path / "ckpt"
    (root / "vision").mkdir(parents=True)
    (root / "speech").mkdir()
    settings.STORAGE_ROOTS = [str(root)]
    return root


@pytest.fixture
def theirs(root, other_team, cluster):
    """Team B's job, three committed steps on disk."""
    job = make_job(other_team, cluster, storage_uri=f"{root}/speech/job-b", phase="running")
    for step in (10, 20, 40):
        write_checkpoint(job, step, weight=torch.full((2, 3), 7.0))
    return job


def plant_link(root, theirs) -> None:
    """What someone who can write in team A's folder does."""
    mine = root / "vision" / "job-a"
    if mine.exists():
        shutil.rmtree(mine)
    os.symlink(root / "speech" / "job-b", mine)


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_download_through_a_planted_link_serves_nothing(api, owner, team, cluster, root,
                                                          theirs):
    mine = make_job(team, cluster, owner, storage_uri=f"{root}/vision/job-a",
                    phase="succeeded")
    row = Checkpoint.objects.create(job=mine, step=40, uri=f"file://{root}/vision/job-a/step-40")
    plant_link(root, theirs)
    for path in ("", "export/model.pt"):
        resp = api(owner).get(f"/api/v1/checkpoints/{row.pk}/files/{path}")
        assert resp.status_code == 503, (path, resp.status_code)
        assert "symbolic link" in resp.json()["detail"]


def test_retention_through_a_planted_link_registers_and_deletes_nothing(team, cluster, root,
                                                                        theirs):
    mine = make_job(team, cluster, storage_uri=f"{root}/vision/job-a", phase="running",
                    keep_last=1)
    plant_link(root, theirs)
    before = {p: digest(p) for p in (root / "speech" / "job-b").rglob("*") if p.is_file()}
    checkpointing.sweep_retention(timezone.now())
    assert not Checkpoint.objects.filter(job=mine).exists()
    after = {p: digest(p) for p in (root / "speech" / "job-b").rglob("*") if p.is_file()}
    assert after == before
    with pytest.raises(Exception, match="symbolic link"):
        checkpointing.open_job_storage(mine)


def test_a_root_that_is_itself_a_link_still_works(settings, tmp_path, team, cluster, owner):
    """The operator's link at or above the root (a mounted volume) is fine."""
    real = tmp_path / "volume"
    (real / "vision").mkdir(parents=True)
    os.symlink(real, tmp_path / "ckpt")
    settings.STORAGE_ROOTS = [str(tmp_path / "ckpt")]
    job = make_job(team, cluster, owner, storage_uri=f"{tmp_path}/ckpt/vision/job-a")
    write_checkpoint(job, 10)
    assert checkpointing.open_job_storage(job).list_steps() == [10]
