"""S3 checkpoint storage against moto's real server on 127.0.0.1."""

import os
import signal

import boto3
import pytest
import torch
from regatta import manifest as mf
from regatta.storage import S3Storage, open_storage

from .helpers import flat_tensors, load_checkpoint

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def s3_env():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        boto3.client("s3").create_bucket(Bucket="ckpts")
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def _commit(store, step: int, files: dict[str, bytes]) -> None:
    entries = {}
    for rel, data in files.items():
        store.write_bytes(f"step-{step}/{rel}", data)
        entries[rel] = {"sha256": mf.sha256_bytes(data), "bytes": len(data)}
    manifest = mf.build_manifest(step, entries)
    store.write_bytes(f"step-{step}/{mf.MANIFEST}", manifest)
    store.write_bytes(f"step-{step}/{mf.MARKER}", mf.marker_for(manifest))


def test_s3_storage_lists_verifies_and_prunes(s3_env, tmp_path):
    store = open_storage("s3://ckpts/unit/run-1")
    assert isinstance(store, S3Storage) and store.list_steps() == []
    for step in (10, 20, 30):
        _commit(store, step, {"__0_0.distcp": b"x" * step, "trainer_state/rank-0.pt": b"s"})
    store.write_bytes("step-40/__0_0.distcp", b"in flight")  # no marker yet

    assert store.list_steps() == [10, 20, 30, 40]
    assert store.committed_steps() == [10, 20, 30]
    assert store.verify(30) == (True, "ok")
    assert store.verify(40)[0] is False and "unfinished" in store.verify(40)[1]
    store.write_bytes("step-30/__0_0.distcp", b"y" * 30)  # same size, other bytes
    assert store.verify(30, deep=False) == (True, "ok")
    assert "sha256" in store.verify(30)[1]
    assert store.newest_verified() == 20

    assert store.apply_retention(keep_last=1) == [10, 20]
    assert store.list_steps() == [30, 40]  # the newest committed and the one in flight stay
    store.delete_step(40)
    assert store.list_steps() == [30]


def test_s3_storage_uploads_large_files_in_parts(s3_env, tmp_path):
    store = open_storage("s3://ckpts/unit/multipart", multipart_threshold=5 << 20)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(6 << 20))
    store.upload_dir(tmp_path, 1, ["big.bin"])

    head = store.client.head_object(Bucket="ckpts", Key="unit/multipart/step-1/big.bin")
    assert head["ETag"].strip('"').endswith("-2")  # two parts
    store.download_file("step-1/big.bin", tmp_path / "back.bin")
    assert mf.sha256_file(tmp_path / "back.bin") == mf.sha256_file(big)


@pytest.mark.slow
def test_the_trainer_saves_to_and_resumes_from_s3(s3_env, launcher, tmp_path):
    uri = "s3://ckpts/jobs/7"
    config = {"max_steps": 8, "checkpoint_every_steps": 4, "keep_last": 1}
    first = launcher.run(config, uri, env=s3_env)
    assert first.proc.returncode == 0, first.log()[-3000:]
    store = open_storage(uri)
    assert store.list_steps() == [8]  # keep_last=1 pruned step-4
    assert store.verify(8) == (True, "ok")
    files = set(store.read_manifest(8)["files"])
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "config.json",
            "trainer_state/rank-0.pt", "trainer_state/rank-1.pt"} <= files

    second = launcher.run({**config, "max_steps": 12}, uri, env=s3_env)

    assert second.proc.returncode == 0, second.log()[-3000:]
    assert "resumed from s3://ckpts/jobs/7/step-8 (step 8)" in second.log()
    assert store.list_steps() == [12] and store.verify(12) == (True, "ok")


def test_one_caller_alone_creates_a_claim_on_s3_and_on_a_file_system(s3_env, tmp_path):
    for store in (open_storage("s3://ckpts/unit/claims"), open_storage(str(tmp_path / "fs"))):
        assert store.create_once("step-7/.handover-claim", b"rank 0\n") is True
        assert store.create_once("step-7/.handover-claim", b"rank 1\n") is False
        assert store.read_bytes("step-7/.handover-claim") == b"rank 0\n"  # the first one's


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_survivor_hands_over_the_last_completed_step_to_s3(s3_env, launcher, tmp_path):
    """As on a shared file system (test_resume.py): a rank SIGKILLed, the
    survivor writes the step it completed, with no collective, through the
    step's claim object; a run resumed from it ends bitwise equal to one
    never interrupted."""
    config = {"max_steps": 16, "checkpoint_every_steps": 4, "keep_last": 10, "dropout": 0.1}
    reference = launcher.run(config, tmp_path / "reference")
    assert reference.proc.returncode == 0, reference.log()[-3000:]
    uri = "s3://ckpts/jobs/handover"
    run = launcher.start({**config, "step_sleep_s": 0.15}, uri, env=s3_env)
    run.wait_for(lambda: "step 10 loss" in run.log(), timeout=60, what="step 10")
    os.kill(max(run.ranks()), signal.SIGKILL)
    run.wait(60)

    store = open_storage(uri)
    handed = store.committed_steps()[-1]
    assert handed >= 10, (store.committed_steps(), run.log()[-3000:])
    assert f"checkpoint step-{handed} handed over by rank 0" in run.log()
    assert store.verify(handed) == (True, "ok")
    assert store.read_bytes(f"step-{handed}/.handover-claim") == b"rank 0\n"

    resumed = launcher.run(config, uri, env=s3_env)

    assert resumed.proc.returncode == 0, resumed.log()[-3000:]
    assert f"step-{handed} (step {handed})" in resumed.log()
    a = flat_tensors(load_checkpoint(tmp_path / "reference" / "step-16", tmp_path / "a.pt"))
    b_dir = store.download_step(16, tmp_path / "resumed-16")
    b = flat_tensors(load_checkpoint(b_dir, tmp_path / "b.pt"))
    assert a.keys() == b.keys() and any(k.startswith("optim.") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
