"""Checkpoints in S3 through the control plane's storage door
(checkpoints/storage.py over the SDK's `regatta.storage`).

AWS cannot be reached from here: moto's server on 127.0.0.1 stands in for
S3 (real HTTP, real boto3, multipart uploads included).
"""

import io
import socket

import pytest
import torch
from django.utils import timezone
from regatta import manifest as mf

from checkpoints import verification
from checkpoints.models import Checkpoint
from checkpoints.storage import (
    S3Options,
    open_uri,
    retention_plan,
    verify_checkpoint,
)
from clusters.models import Cluster
from clusters.settings import ClusterSettings
from controlplane.lib.errors import PermanentError, TemporaryError
from jobs.checkpointing import (
    newest_verified,
    open_job_storage,
    protected_steps,
    sweep_retention,
)
from jobs.checkpointing import prune as apply_retention
from jobs.models import JobEvent, Team, TrainingJob
from tests.support.aws_standin import REGION, aws, client, moto_url, unique  # noqa: F401  (fixtures)

MIB = 1 << 20


@pytest.fixture
def bucket(aws):  # noqa: F811
    name = unique("ckpts")
    client("s3", aws).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_job(db, aws, bucket):  # noqa: F811
    cluster = Cluster.objects.create(
        name="eks-s3", provider=Cluster.Provider.KUBERNETES,
        settings={"api_url": "http://unused", "region": REGION, "s3_endpoint_url": aws,
                  "s3_multipart_threshold_mb": 5},
    )
    team = Team.objects.create(name="nlp")
    return TrainingJob.objects.create(
        name="gpt", team=team, cluster=cluster, num_nodes=2, gpus_per_node=8, keep_last=2,
        storage_uri=f"s3://{bucket}/runs/gpt", phase="running",
    )


def save_checkpoint(job, step: int, tmp_path, big: bool = False, state="committed") -> Checkpoint:
    """What the trainer's rank 0 does: write the files, upload them, then the
    manifest, then the commit marker last; and the report becomes a row."""
    storage = open_job_storage(job)
    local = tmp_path / f"step-{step}"
    (local / "trainer_state").mkdir(parents=True)
    torch.manual_seed(step)
    weights = {"w": torch.randn(1_600_000 if big else 64)}  # 6.4 MB: a multipart upload
    buf = io.BytesIO()
    torch.save(weights, buf)
    (local / "__0_0.distcp").write_bytes(buf.getvalue())
    (local / "trainer_state" / "rank-0.pt").write_bytes(b"step=%d" % step)
    files = ["__0_0.distcp", "trainer_state/rank-0.pt"]
    storage.upload_dir(local, step, files)
    manifest = mf.build_manifest(step, mf.hash_local_files(local, files))
    storage.write_bytes(f"step-{step}/{mf.MANIFEST}", manifest)
    storage.write_bytes(f"step-{step}/{mf.MARKER}", mf.marker_for(manifest))
    return Checkpoint.objects.create(
        job=job, step=step, uri=storage.step_uri(step), state=state,
        bytes=mf.total_bytes(mf.parse_manifest(manifest)),
        manifest_sha256=mf.sha256_bytes(manifest),
    )


def keys(aws, bucket, prefix=""):  # noqa: F811
    pages = client("s3", aws).get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


@pytest.mark.timeout(120)
def test_it_saves_with_a_multipart_upload_and_loads_the_same_weights(s3_job, aws, bucket, tmp_path):  # noqa: F811,E501
    checkpoint = save_checkpoint(s3_job, 100, tmp_path, big=True)
    head = client("s3", aws).head_object(Bucket=bucket, Key="runs/gpt/step-100/__0_0.distcp")
    assert head["ContentLength"] > 5 * MIB
    assert head["ETag"].strip('"').endswith("-2")  # two parts: a multipart upload
    assert checkpoint.uri == f"s3://{bucket}/runs/gpt/step-100"

    storage = open_job_storage(s3_job)
    assert storage.committed_steps() == [100]
    loaded = storage.download_step(100, tmp_path / "restored")
    original = torch.load(tmp_path / "step-100" / "__0_0.distcp")
    restored = torch.load(loaded / "__0_0.distcp")
    assert torch.equal(original["w"], restored["w"])


def test_it_verifies_a_checkpoint_against_its_manifest(s3_job, tmp_path):
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    assert verify_checkpoint(checkpoint, open_job_storage(checkpoint.job)) == (True, "ok")
    assert verification.verify(checkpoint, open_job_storage(s3_job))[0]
    checkpoint.refresh_from_db()
    assert checkpoint.state == Checkpoint.State.VERIFIED and checkpoint.verified_at


def test_a_shard_changed_in_place_is_found_corrupt(s3_job, aws, bucket, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    key = "runs/gpt/step-100/__0_0.distcp"
    s3 = client("s3", aws)
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF  # same size, different bytes
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    ok, reason = verify_checkpoint(checkpoint, open_job_storage(checkpoint.job))
    assert not ok and "__0_0.distcp does not match its sha256" in reason

    assert newest_verified(s3_job, timezone.now()) is None
    checkpoint.refresh_from_db()
    assert checkpoint.state == Checkpoint.State.CORRUPT
    assert JobEvent.objects.filter(job=s3_job, kind="CheckpointCorrupt").count() == 1


def test_a_manifest_other_than_the_one_reported_is_refused(s3_job, tmp_path):
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    checkpoint.manifest_sha256 = "0" * 64
    ok, reason = verify_checkpoint(checkpoint, open_job_storage(checkpoint.job))
    assert not ok and "differs from the reported" in reason


def test_an_unfinished_save_is_not_a_checkpoint(s3_job, bucket, aws, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    client("s3", aws).delete_object(Bucket=bucket, Key="runs/gpt/step-100/COMMITTED")
    ok, reason = verify_checkpoint(checkpoint, open_job_storage(checkpoint.job))
    assert not ok and "no COMMITTED marker" in reason


def test_retention_deletes_files_then_rows_and_keeps_the_newest_verified(s3_job, aws, bucket,  # noqa: F811
                                                                          tmp_path):
    rows = {s: save_checkpoint(s3_job, s, tmp_path) for s in (100, 200, 300, 400, 500)}
    Checkpoint.objects.filter(pk=rows[200].pk).update(state=Checkpoint.State.VERIFIED)

    deleted = apply_retention(s3_job, None)
    assert deleted == [100, 300]
    states = dict(Checkpoint.objects.filter(job=s3_job).values_list("step", "state"))
    assert states == {100: "deleted", 200: "verified", 300: "deleted", 400: "committed",
                      500: "committed"}
    assert keys(aws, bucket, "runs/gpt/step-100/") == []
    assert keys(aws, bucket, "runs/gpt/step-300/") == []
    assert len(keys(aws, bucket, "runs/gpt/step-200/")) == 4
    (event,) = JobEvent.objects.filter(job=s3_job, kind="CheckpointsDeleted")
    assert event.evidence["steps"] == [100, 300]

    assert apply_retention(s3_job, None) == []  # nothing more to do, nothing more written
    assert JobEvent.objects.filter(job=s3_job, kind="CheckpointsDeleted").count() == 1


def test_retention_never_deletes_the_last_verified_one_nor_a_chosen_restart(s3_job, tmp_path):
    for step in (100, 200, 300, 400):
        save_checkpoint(s3_job, step, tmp_path)
    Checkpoint.objects.filter(job=s3_job, step=100).update(state=Checkpoint.State.VERIFIED)
    Checkpoint.objects.filter(job=s3_job, step=300).update(state=Checkpoint.State.CORRUPT)
    TrainingJob.objects.filter(pk=s3_job.pk).update(keep_last=1, restart_from_step=200)
    s3_job.refresh_from_db()
    keep, delete = retention_plan(s3_job, protected_steps(s3_job))
    assert sorted(c.step for c in keep) == [100, 200, 400]
    assert [c.step for c in delete] == [300]
    assert apply_retention(s3_job, None) == [300]


def test_retention_keeps_everything_while_nothing_is_loadable(s3_job, tmp_path):
    save_checkpoint(s3_job, 100, tmp_path, state="corrupt")
    save_checkpoint(s3_job, 200, tmp_path, state="corrupt")
    assert apply_retention(s3_job, None) == []
    assert set(Checkpoint.objects.values_list("state", flat=True)) == {"corrupt"}


def test_the_retention_sweep_prunes_s3_jobs(s3_job, tmp_path):
    for step in (100, 200, 300):
        save_checkpoint(s3_job, step, tmp_path)
    assert sweep_retention(now=None) == 1
    assert Checkpoint.objects.get(job=s3_job, step=100).state == Checkpoint.State.DELETED


def test_the_sweep_registers_and_prunes_s3_folders_whose_reports_were_lost(s3_job, aws, bucket,  # noqa: F811
                                                                           tmp_path):
    for step in (100, 200, 300):
        save_checkpoint(s3_job, step, tmp_path)
    Checkpoint.objects.filter(job=s3_job, step__in=(100, 200)).delete()  # reports lost

    assert sweep_retention(now=None) == 1

    states = dict(Checkpoint.objects.filter(job=s3_job).values_list("step", "state"))
    assert states == {100: "deleted", 200: "committed", 300: "committed"}
    assert keys(aws, bucket, "runs/gpt/step-100/") == []
    assert len(keys(aws, bucket, "runs/gpt/step-200/")) == 4


def test_unreachable_storage_deletes_no_row(s3_job, tmp_path):
    for step in (100, 200, 300):
        save_checkpoint(s3_job, step, tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    storage = open_uri(s3_job.storage_uri, S3Options(region=REGION, endpoint_url=closed,
                                                  max_attempts=1))
    with pytest.raises(TemporaryError):
        apply_retention(s3_job, None, storage=storage)
    assert not Checkpoint.objects.filter(state=Checkpoint.State.DELETED).exists()
    assert not JobEvent.objects.filter(kind="CheckpointsDeleted").exists()


@pytest.mark.parametrize("settings, key", [
    ({"s3_multipart_threshold_mb": 1}, "s3_multipart_threshold_mb"),
    ({"s3_max_attempts": 0}, "s3_max_attempts"),
])
def test_bad_storage_settings_are_permanent(settings, key):
    with pytest.raises(PermanentError, match=key):
        ClusterSettings.parse(settings, "kubernetes")


def test_a_uri_of_an_unknown_scheme_is_permanent():
    with pytest.raises(PermanentError, match="gs"):
        open_uri("gs://bucket/prefix")


def test_reports_a_rank_left_in_s3_are_collected_once_and_deleted(s3_job):
    from regatta import spool

    from jobs.metrics.models import MetricPoint
    from jobs.worker_api.undelivered import collect
    from tests.api_factories import make_attempt

    attempt, _ = make_attempt(s3_job)
    storage = open_job_storage(s3_job)
    points = [{"rank": 0, "name": "loss", "step": s, "value": 1.0 / s} for s in range(1, 11)]
    items = [("events", {"kind": "finished", "rank": 0, "data": {"step": 10}, "key": "k-1"}),
             ("metrics", {"batch_id": "b-0", "job_id": str(s3_job.pk), "points": points})]
    key = spool.handoff_key(str(attempt.pk), 0, "abcd")
    storage.write_bytes(key, spool.handoff_bytes(
        {"job_id": str(s3_job.pk), "attempt_id": str(attempt.pk), "rank": 0}, items))
    storage.write_bytes("reports/elsewhere.txt", b"not ours")

    assert storage.list_keys(f"reports/attempt-{attempt.pk}/") == [key]
    assert collect(attempt, storage).files == 1
    assert collect(attempt, storage).files == 0

    assert MetricPoint.objects.filter(attempt=attempt).count() == 10
    assert JobEvent.objects.filter(job=s3_job, kind="TrainerFinished").count() == 1
    assert storage.list_keys("reports/") == ["reports/elsewhere.txt"]
