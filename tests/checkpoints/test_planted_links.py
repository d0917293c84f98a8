"""A symbolic link planted in a team's storage after submission (team A's
job folder, one of its step folders, a manifest or a trace replaced by a link
to team B's) must not hand A's download B's weights, nor be reported, restarted
from, resumed from, or let retention register, delete or choke on B's steps."""

import hashlib
import os
import shutil

import pytest
import torch
from django.utils import timezone
from regatta.storage import profile_key

from checkpoints.models import Checkpoint
from jobs import checkpointing
from jobs.models import TrainingJob
from jobs.profiling import requests as profile_requests
from tests.api_factories import make_attempt, make_job, worker_client
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


# --- a link one level down: a step folder, a manifest, a trace ----------------

@pytest.fixture
def mine(root, team, cluster, owner):
    """Team A's running job with a real committed step of its own."""
    job = make_job(team, cluster, owner, storage_uri=f"{root}/vision/job-a", phase="running")
    write_checkpoint(job, 100, weight=torch.full((2, 3), 1.0))
    return job


def link_step(root, step: int, their_step: int = 40) -> None:
    """What a rank of team A's job can do: its step folder made a link to
    team B's."""
    os.symlink(root / "speech" / "job-b" / f"step-{their_step}",
               root / "vision" / "job-a" / f"step-{step}")


def report(job, step: int, uri: str):
    attempt, token = make_attempt(job)
    return worker_client(token).post(
        f"/api/v1/worker/attempts/{attempt.pk}/checkpoints",
        {"step": step, "uri": uri, "bytes": 1, "manifest_sha256": "ab" * 32}, format="json")


@pytest.mark.parametrize("spelling", ["file://{}", "{}"])
def test_a_step_folder_that_is_a_link_is_refused_when_reported(root, mine, theirs, spelling):
    link_step(root, 500)
    resp = report(mine, 500, spelling.format(root / "vision" / "job-a" / "step-500"))
    assert resp.status_code == 400, resp.content
    assert "symbolic link" in resp.json()["uri"][0]
    assert not Checkpoint.objects.filter(job=mine, step=500).exists()


def test_a_real_step_folder_whose_manifest_is_a_link_is_refused_when_reported(root, mine,
                                                                               theirs):
    folder = root / "vision" / "job-a" / "step-600"
    folder.mkdir()
    for name in ("manifest.json", "COMMITTED"):
        os.symlink(root / "speech" / "job-b" / "step-40" / name, folder / name)
    resp = report(mine, 600, f"file://{folder}")
    assert resp.status_code == 400 and "symbolic link" in resp.json()["uri"][0]
    # Its own real folder is still taken.
    assert report(mine, 100, f"file://{root}/vision/job-a/step-100").status_code in (200, 201)


def test_a_linked_step_that_got_a_row_lists_and_serves_nothing_of_theirs(api, owner, root,
                                                                         mine, theirs):
    """A row made before the link was caught (or by another path)."""
    link_step(root, 500)
    row = Checkpoint.objects.create(job=mine, step=500,
                                    uri=f"file://{root}/vision/job-a/step-500")
    for path in ("", "manifest.json", "COMMITTED"):
        resp = api(owner).get(f"/api/v1/checkpoints/{row.pk}/files/{path}")
        assert resp.status_code == 409, (path, resp.status_code)
        assert "symbolic link" in resp.json()["detail"]
    # Team A's own step still lists and serves.
    own = Checkpoint.objects.get(job=mine, step=100)
    assert api(owner).get(f"/api/v1/checkpoints/{own.pk}/files/").status_code == 200


def test_a_restart_from_a_linked_step_is_refused(api, owner, root, mine, theirs):
    link_step(root, 500)
    Checkpoint.objects.create(job=mine, step=500, uri=f"file://{root}/vision/job-a/step-500")
    resp = api(owner).post(f"/api/v1/jobs/{mine.pk}/restart/", {"from_step": 500},
                           format="json")
    assert resp.status_code == 409, resp.content
    assert "symbolic link" in resp.json()["detail"]
    mine.refresh_from_db()
    assert mine.restart_from_step is None


def test_a_resume_skips_a_linked_step_as_corrupt(root, mine, theirs):
    link_step(root, 500)
    Checkpoint.objects.create(job=mine, step=500, uri=f"file://{root}/vision/job-a/step-500")
    chosen = checkpointing.newest_verified(mine, timezone.now())
    assert chosen.step == 100
    linked = Checkpoint.objects.get(job=mine, step=500)
    assert linked.state == Checkpoint.State.CORRUPT and "symbolic link" in linked.state_reason


def test_retention_removes_a_linked_step_and_leaves_their_files(root, mine, theirs, caplog):
    link_step(root, 50)
    Checkpoint.objects.create(job=mine, step=50, uri=f"file://{root}/vision/job-a/step-50")
    write_checkpoint(mine, 200)
    TrainingJob.objects.filter(pk=mine.pk).update(keep_last=1)
    before = {p: digest(p) for p in (root / "speech" / "job-b").rglob("*") if p.is_file()}
    for _ in range(2):
        checkpointing.sweep_retention(timezone.now())
    assert "retention for job" not in caplog.text  # no sweep failed
    states = dict(Checkpoint.objects.filter(job=mine).values_list("step", "state"))
    assert states == {50: "deleted", 100: "deleted", 200: "committed"}
    assert not os.path.lexists(root / "vision" / "job-a" / "step-50")
    after = {p: digest(p) for p in (root / "speech" / "job-b").rglob("*") if p.is_file()}
    assert after == before


def test_retention_registers_no_linked_step_it_finds(root, mine, theirs):
    link_step(root, 500)
    checkpointing.sweep_retention(timezone.now())
    assert not Checkpoint.objects.filter(job=mine, step=500).exists()


def test_a_profile_trace_that_is_a_link_is_refused_when_reported(root, mine, theirs):
    attempt, token = make_attempt(mine)
    request_id = profile_requests.request(attempt, 5, "user:olivia")[0]
    key = profile_key(11, request_id, 0)
    trace = root / "vision" / "job-a" / key
    trace.parent.mkdir(parents=True)
    os.symlink(root / "speech" / "job-b" / "step-40" / "manifest.json", trace)
    resp = worker_client(token).post(
        f"/api/v1/worker/attempts/{attempt.pk}/profiles",
        {"request_id": request_id, "rank": 0, "start_step": 11, "steps": 5, "bytes": 10,
         "uri": f"file://{trace}"}, format="json")
    assert resp.status_code == 400 and "symbolic link" in resp.json()["uri"][0]
