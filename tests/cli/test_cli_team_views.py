"""The CLI's views of what the API offers a team, against a live server over
real HTTP: artifacts and their download (checksums verified), metrics as a
table and sparklines, attempts, goodput; and `submit` resolving relative
entrypoint paths against the job file's folder."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from django.utils import timezone

from checkpoints.export import export_final
from checkpoints.models import ModelArtifact
from cli.main import resolve_entrypoint
from jobs.checkpointing import open_job_storage
from jobs.models import TrainingJob
from tests.fleet_helpers import write_checkpoint
from tests.frontend.factories import make_job, rich_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120),
              pytest.mark.usefixtures("fleet_dirs")]


@pytest.fixture
def artifact(team, cluster, owner):
    job = make_job(team, cluster, owner, name="exported", phase="succeeded")
    final = write_checkpoint(job, 40, weight=torch.arange(6.0).reshape(2, 3))
    return export_final(job, final, open_job_storage(job), timezone.now())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_artifacts_lists_the_team_s_models_and_filters_by_job(logged_in, teammate, artifact,
                                                              other_team, cluster):
    theirs = make_job(other_team, cluster, name="theirs")
    ModelArtifact.objects.create(job=theirs, name="speech-model", uri="/tmp/x")
    regatta = logged_in(teammate)
    out = regatta("artifacts").output
    assert out.splitlines()[0].split() == ["ID", "NAME", "VERSION", "JOB", "FORMAT", "SIZE",
                                           "SHA256", "AGE"]
    assert artifact.name in out and "torch" in out and "speech-model" not in out
    assert artifact.sha256[:12] in out
    listed = json.loads(regatta("artifacts", "--job", artifact.job_id, "--json").output)
    assert [a["id"] for a in listed] == [artifact.pk]
    assert json.loads(regatta("artifacts", "--job", theirs.pk, "--json").output) == []


def test_download_writes_every_file_and_verifies_its_checksum(logged_in, owner, artifact,
                                                              tmp_path):
    regatta = logged_in(owner)
    out = tmp_path / "got"
    result = regatta("download", artifact.pk, "--out", out)
    assert result.exit_code == 0, result.output + result.stderr
    exported = Path(artifact.uri).parent
    for name in ("model.pt", "config.json"):
        assert (out / name).read_bytes() == (exported / name).read_bytes()
        assert sha(out / name) == artifact.files[name]["sha256"]
    assert "model.pt" in result.output and "sha256 ok" in result.output
    assert result.output.rstrip().endswith(str(out))
    assert not list(out.glob("*.partial"))
    weights = torch.load(out / "model.pt", map_location="cpu", weights_only=True)
    assert torch.equal(weights["w"], torch.arange(6.0).reshape(2, 3))


def test_download_of_one_file_as_json(logged_in, owner, artifact, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    regatta = logged_in(owner)
    result = regatta("download", artifact.pk, "--file", "model.pt", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.output)
    default = tmp_path / f"{artifact.name}-v1"
    assert data["out"] == str(default)
    assert [(f["path"], f["verified"]) for f in data["files"]] == [("model.pt", True)]
    assert data["files"][0]["sha256"] == artifact.files["model.pt"]["sha256"]
    assert sorted(p.name for p in default.iterdir()) == ["model.pt"]
    missing = regatta("download", artifact.pk, "--file", "weights.bin")
    assert missing.exit_code == 1 and "no file 'weights.bin'" in missing.stderr


def test_a_file_that_does_not_match_its_checksum_is_deleted_and_fails(logged_in, owner,
                                                                     artifact, tmp_path):
    files = dict(artifact.files)
    files["model.pt"] = {**files["model.pt"], "sha256": "0" * 64}
    ModelArtifact.objects.filter(pk=artifact.pk).update(files=files)
    regatta = logged_in(owner)
    out = tmp_path / "got"
    result = regatta("download", artifact.pk, "--out", out, "--file", "model.pt")
    assert result.exit_code == 1
    assert "model.pt: got" in result.stderr and "0" * 64 in result.stderr
    assert not (out / "model.pt").exists() and not list(out.glob("*"))


def test_another_team_s_artifact_cannot_be_downloaded(logged_in, outsider, artifact,
                                                      tmp_path):
    regatta = logged_in(outsider)
    result = regatta("download", artifact.pk, "--out", tmp_path / "got")
    assert result.exit_code == 1 and "HTTP 404" in result.stderr
    assert not (tmp_path / "got").exists()


def test_metrics_show_the_last_steps_and_a_sparkline_per_metric(logged_in, owner, team,
                                                                cluster):
    job = rich_job(team, cluster, owner, points=200)
    regatta = logged_in(owner)
    result = regatta("metrics", job.pk, "--name", "loss", "--name", "val_loss", "--last", 3)
    assert result.exit_code == 0, result.stderr
    lines = result.output.splitlines()
    assert lines[0].split() == ["STEP", "loss", "val_loss"]
    # loss runs to step 149 (the second attempt wins where both reported).
    assert [line.split()[0] for line in lines[1:4]] == ["147", "148", "149"]
    assert lines[3].split()[1] == f"{4.0 / (1 + 149 / 50):.4g}"
    spark = next(line for line in lines if line.startswith("loss "))
    assert any(block in spark for block in "▁▂▃▄▅▆▇█")
    assert "min" in spark and "(149 steps)" in spark
    everything = json.loads(regatta("metrics", job.pk, "--json").output)
    assert set(everything["metrics"]) == {"loss", "val_loss", "tokens_per_s"}
    assert everything["metrics"]["loss"]["total"] == 149
    assert everything["metrics"]["loss"]["points"][-1] == [149, pytest.approx(4.0 / (1 + 149 / 50))]
    tail = json.loads(regatta("metrics", job.pk, "--name", "loss", "--last", 2, "--json").output)
    assert [p[0] for p in tail["metrics"]["loss"]["points"]] == [148, 149]


def test_metrics_of_a_job_without_any(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    result = logged_in(owner)("metrics", job.pk)
    assert result.exit_code == 0 and "reported no metrics yet" in result.output


def test_attempts_show_where_each_ran_and_how_it_ended(logged_in, teammate, team, cluster):
    job = rich_job(team, cluster, points=200)
    regatta = logged_in(teammate)
    lines = regatta("attempts", job.pk).output.splitlines()
    assert lines[0].split() == ["#", "STATE", "NODES", "RESUMED", "STEP", "STARTED", "RAN",
                                "EXIT", "FAILURE", "REASON"]
    first, second = lines[1].split(), lines[2].split()
    assert first[:4] == ["1", "failed", "cpu-a-0,cpu-a-1", "-"]
    assert "hardware" in first and "-9" in first and "XID" in lines[1]
    assert second[:4] == ["2", "running", "cpu-a-0,cpu-a-2", "100"]
    data = json.loads(regatta("attempts", job.pk, "--json").output)
    assert [a["failure_class"] for a in data] == ["hardware", None]


def test_goodput_shows_each_category_and_the_ratio(logged_in, owner, team, cluster, outsider):
    job = rich_job(team, cluster, points=200)
    regatta = logged_in(owner)
    out = regatta("goodput", job.pk).output
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:7]}
    assert rows["productive"][2:] == ["1.50", "89.8%"]
    assert rows["rollback"][2:] == ["0.10", "6.0%"]
    assert "Goodput: 89.8% of 1.67 GPU-hours were productive training." in out
    data = json.loads(regatta("goodput", job.pk, "--json").output)
    assert data["goodput_ratio"] == pytest.approx(1.5 / 1.67)
    result = logged_in(outsider)("goodput", job.pk)
    assert result.exit_code == 1 and "HTTP 404" in result.stderr


def test_submit_resolves_entrypoint_paths_against_the_job_file_s_folder(
        logged_in, owner, team, tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "configs" / "run.yaml").write_text("lr: 0.1\n")
    spec = {"name": "own-program", "team": "vision", "cluster": "cpu-a", "num_nodes": 1,
            "gpus_per_node": 1, "entrypoint": ["python", "train.py", "--config",
                                               "configs/run.yaml", "-m", "train.py",
                                               "missing.py", "/abs/elsewhere.py", "--lr"]}
    (project / "job.yaml").write_text(yaml.safe_dump(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = logged_in(owner)("submit", "../project/job.yaml")
    assert result.exit_code == 0, result.stderr
    job = TrainingJob.objects.get(name="own-program")
    assert job.entrypoint == ["python", str(project / "train.py"), "--config",
                              str(project / "configs" / "run.yaml"), "-m", "train.py",
                              "missing.py", "/abs/elsewhere.py", "--lr"]
    assert f"entrypoint: train.py -> {project / 'train.py'}" in result.stderr


def test_the_resolution_leaves_a_spec_without_a_list_entrypoint_alone(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert resolve_entrypoint({"name": "x"}, tmp_path) == []
    spec = {"entrypoint": "train.py"}
    assert resolve_entrypoint(spec, tmp_path) == [] and spec["entrypoint"] == "train.py"
    spec = {"entrypoint": ["torchrun", "train.py"]}
    assert resolve_entrypoint(spec, tmp_path) == [("train.py", str(tmp_path / "train.py"))]
