"""A job's storage lies under a declared storage root, inside its own team's
folder, canonicalised; anything else is a 400 that says why and writes
nothing. Clusters may narrow the roots, never widen them."""

import os

import pytest

from checkpoints import confinement
from controlplane.env import ImproperlyConfiguredEnv, env_storage_roots
from jobs.models import JobEvent, TrainingJob

URL = "/api/v1/jobs/"


def spec(**overrides):
    return {"name": "gpt-tiny", "cluster": "cpu-a", "num_nodes": 1, "gpus_per_node": 2,
            "hyperparameters": {"model": "nano", "max_steps": 20}, **overrides}


@pytest.fixture
def root(settings, tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    settings.STORAGE_ROOTS = [str(root), "s3://team-bucket/runs"]
    return root


def submit(api, user, **overrides):
    return api(user).post(URL, spec(**overrides), format="json")


@pytest.mark.parametrize("uri", [
    "/etc/passwd",
    "file:///etc/passwd",
    "/tmp/../../etc/shadow",
    "s3://other-bucket/x",
    "s3://team-bucket/runs/speech/run1",  # another team's folder
    "s3://team-bucket/runs/vision/../speech/run1",
    "s3://team-bucket/elsewhere/vision/run1",
    "http://example.com/vision/run1",
    "~/x",
    "relative/vision/run1",
    "file://host/vision/run1",
])
def test_it_refuses_storage_outside_the_teams_folder_and_writes_nothing(api, owner, root, uri):
    resp = submit(api, owner, storage_uri=uri)
    assert resp.status_code == 400, resp.content
    assert resp.data["storage_uri"] and all(str(m) for m in resp.data["storage_uri"])
    assert not TrainingJob.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize("suffix", ["speech/run1", "vision/../speech/run1", "vision",
                                    "vision/run\n1"])
def test_it_refuses_another_teams_folder_the_team_folder_itself_and_a_newline(
    api, owner, root, suffix
):
    resp = submit(api, owner, storage_uri=f"{root}/{suffix}")
    assert resp.status_code == 400, resp.content
    assert "storage_uri" in resp.data
    assert not TrainingJob.objects.exists()


def test_the_message_says_where_the_teams_storage_may_go(api, owner, root):
    resp = submit(api, owner, storage_uri="/etc/passwd")
    assert f"{root}/vision/" in str(resp.data["storage_uri"][0])


@pytest.mark.parametrize(("given", "stored"), [
    ("{root}/vision/run1", "{root}/vision/run1"),
    ("file://{root}/vision/run1/", "{root}/vision/run1"),
    ("{root}/vision/a/../run1", "{root}/vision/run1"),
    ("{root}//vision///run1", "{root}/vision/run1"),
    ("s3://team-bucket/runs/vision/gpt/", "s3://team-bucket/runs/vision/gpt"),
])
def test_it_stores_the_canonical_form_of_an_allowed_uri(api, owner, root, given, stored):
    resp = submit(api, owner, storage_uri=given.format(root=root))
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.get().storage_uri == stored.format(root=root)


def test_it_refuses_a_path_through_a_symlink(api, owner, root, tmp_path):
    (root / "vision").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "vision" / "link")
    resp = submit(api, owner, storage_uri=f"{root}/vision/link/run1")
    assert resp.status_code == 400
    assert "symbolic link" in str(resp.data["storage_uri"][0])


def test_a_job_naming_no_storage_gets_its_teams_folder_under_the_first_root(api, owner, root):
    resp = submit(api, owner)
    job = TrainingJob.objects.get()
    assert job.storage_uri == f"{root}/vision/job-{job.pk}"
    assert resp.data["storage_uri"] == job.storage_uri


def test_with_no_roots_declared_the_checkpoint_root_is_the_only_one(api, owner, settings,
                                                                    tmp_path):
    settings.STORAGE_ROOTS = []
    settings.CHECKPOINT_ROOT = tmp_path / "state-ckpt"
    assert submit(api, owner, storage_uri=f"{tmp_path}/state-ckpt/vision/a").status_code == 201
    assert submit(api, owner, storage_uri=f"{tmp_path}/other/vision/a").status_code == 400


def test_a_cluster_narrows_the_roots_and_its_first_is_the_default(api, owner, root, cluster):
    cluster.settings = {"storage_roots": ["s3://team-bucket/runs/cpu-a"]}
    cluster.save()
    assert submit(api, owner, storage_uri=f"{root}/vision/run1").status_code == 400
    ok = submit(api, owner, storage_uri="s3://team-bucket/runs/cpu-a/vision/run1")
    assert ok.status_code == 201, ok.content
    default = submit(api, owner).data
    assert default["storage_uri"] == f"s3://team-bucket/runs/cpu-a/vision/job-{default['id']}"


@pytest.mark.parametrize("declared", [["s3://someone-else/x"], "not-a-list", [], ["relative"]])
def test_a_cluster_cannot_widen_the_roots_or_declare_nonsense(api, owner, root, cluster,
                                                              declared):
    cluster.settings = {"storage_roots": declared}
    cluster.save()
    resp = submit(api, owner)
    assert resp.status_code == 400
    assert "cpu-a" in str(resp.data["cluster"][0])
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(("storage", "step", "uri", "ok"), [
    ("/r/vision/job-1", 7, "/r/vision/job-1/step-7", True),
    ("/r/vision/job-1", 7, "file:///r/vision/job-1/step-7", True),
    ("file:///r/vision/job-1/", 7, "file:///r/vision/job-1/step-7", True),
    ("s3://b/runs/vision/job-1", 7, "s3://b/runs/vision/job-1/step-7", True),
    ("/r/vision/job-1", 7, "/r/vision/job-1/step-8", False),
    ("/r/vision/job-1", 7, "/r/vision/job-1/step-7/../../job-2/step-7", False),
    ("/r/vision/job-1", 7, "/r/vision/job-2/step-7", False),
    ("/r/vision/job-1", 7, "http://r/vision/job-1/step-7", False),
    ("/r/vision/job-1", 7, "~/step-7", False),
    ("/r/vision/job-1", 7, "/r/vision/job-1/step-7\n", False),
    ("s3://b/runs/vision/job-1", 7, "s3://c/runs/vision/job-1/step-7", False),
])
def test_a_worker_may_report_only_its_jobs_step_folder(storage, step, uri, ok):
    assert confinement.reported_step_uri_ok(storage, step, uri) is ok


def test_the_roots_variable_names_itself_when_a_root_is_bad(monkeypatch):
    monkeypatch.setenv("REGATTA_STORAGE_ROOTS", "/data/ckpt,relative/x")
    with pytest.raises(ImproperlyConfiguredEnv, match="REGATTA_STORAGE_ROOTS"):
        env_storage_roots("REGATTA_STORAGE_ROOTS")
    monkeypatch.setenv("REGATTA_STORAGE_ROOTS", "/data//ckpt/, file:///mnt/x, s3://bkt/p/")
    assert env_storage_roots("REGATTA_STORAGE_ROOTS") == ["/data/ckpt", "/mnt/x", "s3://bkt/p"]
