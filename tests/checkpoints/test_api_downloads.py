"""Downloading an exported model's files and a committed checkpoint's files:
listed with sizes and checksums, streamed as attachments, scoped like the
job, and never a byte from outside the artifact's or the step's folder."""

import hashlib
import os
from pathlib import Path

import pytest
import torch
from django.utils import timezone
from rest_framework.test import APIClient

from checkpoints.export import export_final
from checkpoints.models import Checkpoint, ModelArtifact
from jobs.checkpointing import open_job_storage
from tests.api_factories import make_job
from tests.fleet_helpers import write_checkpoint

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def succeeded_job(team, cluster, owner):
    return make_job(team, cluster, owner, phase="succeeded")


@pytest.fixture
def final(succeeded_job):
    return write_checkpoint(succeeded_job, 40, weight=torch.arange(6.0).reshape(2, 3))


@pytest.fixture
def artifact(succeeded_job, final):
    return export_final(succeeded_job, final, open_job_storage(succeeded_job), timezone.now())


def body(resp) -> bytes:
    return b"".join(resp.streaming_content)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_files_of_an_export_are_listed_with_sizes_and_checksums(api, teammate, artifact):
    resp = api(teammate).get(f"/api/v1/artifacts/{artifact.pk}/files/")
    assert resp.status_code == 200
    files = {f["path"]: f for f in resp.json()["files"]}
    assert set(files) == {"model.pt", "config.json"}
    model = Path(artifact.uri)
    assert files["model.pt"]["bytes"] == model.stat().st_size
    assert files["model.pt"]["sha256"] == sha(model.read_bytes()) == artifact.sha256
    assert files["model.pt"]["url"].endswith(f"/api/v1/artifacts/{artifact.pk}/files/model.pt")
    assert resp.json()["bytes"] == artifact.bytes


def test_a_file_is_streamed_as_an_attachment_with_its_length(api, owner, artifact):
    resp = api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt")
    assert resp.status_code == 200
    assert resp.streaming
    data = body(resp)
    assert data == Path(artifact.uri).read_bytes()
    assert resp["Content-Length"] == str(len(data))
    assert resp["Content-Disposition"] == 'attachment; filename="model.pt"'
    assert resp["Content-Type"] == "application/octet-stream"
    assert resp["X-Checksum-Sha256"] == sha(data)


def test_the_downloaded_weights_load(api, owner, artifact, tmp_path):
    out = tmp_path / "model.pt"
    out.write_bytes(body(api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt")))
    weights = torch.load(out, map_location="cpu", weights_only=True)
    assert torch.equal(weights["w"], torch.arange(6.0).reshape(2, 3))


def test_a_binary_accept_header_gets_the_file_and_an_error_stays_json(api, owner, artifact):
    client = api(owner)
    ok = client.get(f"/api/v1/artifacts/{artifact.pk}/files/config.json",
                    HTTP_ACCEPT="application/octet-stream")
    assert ok.status_code == 200 and b"nano" in body(ok)
    missing = client.get(f"/api/v1/artifacts/{artifact.pk}/files/nope.pt",
                         HTTP_ACCEPT="application/octet-stream")
    assert missing.status_code == 404
    assert "nope.pt" in missing.json()["detail"]


def test_another_team_s_artifact_is_not_found_and_an_operator_s_is(api, outsider, operator,
                                                                   artifact):
    for path in ("files/", "files/model.pt"):
        resp = api(outsider).get(f"/api/v1/artifacts/{artifact.pk}/{path}")
        assert resp.status_code == 404, path
        assert b"nano" not in resp.content
    assert api(operator).get(f"/api/v1/artifacts/{artifact.pk}/files/").status_code == 200
    assert api(operator).get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt").status_code \
        == 200


def test_anonymous_callers_and_worker_tokens_are_refused(artifact):
    from tests.api_factories import make_attempt, worker_client

    _, worker_token = make_attempt(artifact.job)
    for client in (APIClient(), worker_client(worker_token)):
        for path in ("files/", "files/model.pt"):
            assert client.get(f"/api/v1/artifacts/{artifact.pk}/{path}").status_code == 401


@pytest.mark.parametrize("path", [
    "../" * 30 + "etc/passwd",
    "..%2F" * 30 + "etc%2Fpasswd",
    "%2E%2E/" * 30 + "etc/passwd",
    "/etc/passwd",
    "./model.pt",
    "export/../model.pt",
    "model.pt/",
    "a//model.pt",
    "model.pt%00.json",
    "..\\" * 30 + "etc\\passwd",
])
def test_a_path_that_leaves_the_folder_or_is_not_plain_is_not_found(api, owner, artifact,
                                                                    path):
    resp = api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/{path}")
    assert resp.status_code == 404, (path, resp.status_code)
    assert b"root:" not in resp.content


def test_a_link_planted_in_the_artifact_folder_is_not_followed(api, owner, artifact, tmp_path):
    folder = Path(artifact.uri).parent
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    (folder / "model.pt").unlink()
    os.symlink(secret, folder / "model.pt")
    resp = api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt")
    assert resp.status_code == 404
    assert b"root:" not in resp.content


def test_a_file_not_in_the_export_listing_is_not_served(api, owner, artifact):
    (Path(artifact.uri).parent / "extra.bin").write_bytes(b"not exported")
    assert api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/extra.bin").status_code \
        == 404


def test_an_artifact_row_pointing_outside_the_registry_serves_nothing(api, owner, succeeded_job,
                                                                      tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "model.pt").write_bytes(b"weights")
    row = ModelArtifact.objects.create(
        job=succeeded_job, name="stray", uri=str(outside / "model.pt"), format="torch",
        files={"model.pt": {"sha256": sha(b"weights"), "bytes": 7}})
    assert api(owner).get(f"/api/v1/artifacts/{row.pk}/files/model.pt").status_code == 404
    etc = ModelArtifact.objects.create(job=succeeded_job, name="etc", version=2, uri="/etc",
                                       format="files")
    assert api(owner).get(f"/api/v1/artifacts/{etc.pk}/files/").json()["files"] == []
    assert api(owner).get(f"/api/v1/artifacts/{etc.pk}/files/passwd").status_code == 404


def test_an_artifact_folder_reached_through_a_link_in_the_registry_serves_nothing(
        api, owner, succeeded_job, artifact, settings):
    """A link below the registry, even to another artifact inside it, is
    not the artifact the row names."""
    registry = Path(settings.ARTIFACT_ROOT)
    os.symlink(Path(artifact.uri).parent.parent, registry / "vision-linked")
    row = ModelArtifact.objects.create(
        job=succeeded_job, name="vision-linked", version=9, format="torch",
        uri=str(registry / "vision-linked" / "v1" / "model.pt"), files=artifact.files)
    for path in ("model.pt", "config.json"):
        assert api(owner).get(f"/api/v1/artifacts/{row.pk}/files/{path}").status_code == 404
    # A linked file inside a real artifact folder is not served either.
    os.symlink(Path(artifact.uri), Path(artifact.uri).parent / "linked.pt")
    ModelArtifact.objects.filter(pk=artifact.pk).update(
        files={**artifact.files, "linked.pt": artifact.files["model.pt"]})
    assert api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/linked.pt").status_code \
        == 404
    assert api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt").status_code \
        == 200


def test_an_artifact_without_a_recorded_listing_lists_its_folder(api, owner, artifact):
    ModelArtifact.objects.filter(pk=artifact.pk).update(files={})
    files = api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/").json()["files"]
    assert [(f["path"], f["sha256"]) for f in files] == [("config.json", ""), ("model.pt", "")]
    resp = api(owner).get(f"/api/v1/artifacts/{artifact.pk}/files/config.json")
    assert resp.status_code == 200 and "X-Checksum-Sha256" not in resp


# -- checkpoints ------------------------------------------------------------

def test_a_committed_checkpoint_s_files_are_listed_and_streamed(api, teammate, final):
    client = api(teammate)
    resp = client.get(f"/api/v1/checkpoints/{final.pk}/files/")
    assert resp.status_code == 200
    files = {f["path"]: f for f in resp.json()["files"]}
    assert {"export/model.pt", "config.json", ".metadata", "manifest.json",
            "COMMITTED"} <= set(files)
    folder = Path(final.uri.removeprefix("file://"))
    for rel in ("export/model.pt", "manifest.json"):
        got = client.get(f"/api/v1/checkpoints/{final.pk}/files/{rel}")
        assert got.status_code == 200
        data = body(got)
        assert data == (folder / rel).read_bytes()
        assert got["Content-Length"] == str(files[rel]["bytes"])
    assert files["export/model.pt"]["sha256"] == sha((folder / "export/model.pt").read_bytes())


def test_a_checkpoint_that_is_not_loadable_is_a_conflict(api, owner, final):
    Checkpoint.objects.filter(pk=final.pk).update(state=Checkpoint.State.CORRUPT)
    resp = api(owner).get(f"/api/v1/checkpoints/{final.pk}/files/")
    assert resp.status_code == 409 and resp.json()["current"] == "corrupt"


def test_another_team_s_checkpoint_and_paths_out_of_the_step_are_not_found(api, owner,
                                                                          outsider, final):
    assert api(outsider).get(f"/api/v1/checkpoints/{final.pk}/files/").status_code == 404
    assert api(outsider).get(
        f"/api/v1/checkpoints/{final.pk}/files/manifest.json").status_code == 404
    for path in ("../step-40/manifest.json", "../" * 30 + "etc/passwd", "/etc/passwd",
                 "nothing.bin"):
        assert api(owner).get(f"/api/v1/checkpoints/{final.pk}/files/{path}").status_code \
            == 404, path


def test_a_checkpoint_whose_files_are_gone_is_not_found(api, owner, final):
    storage = open_job_storage(final.job)
    storage.delete_step(final.step)
    resp = api(owner).get(f"/api/v1/checkpoints/{final.pk}/files/")
    assert resp.status_code == 404 and "no manifest" in resp.json()["detail"]
