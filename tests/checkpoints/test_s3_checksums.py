"""S3 checkpoints verified by S3's own checksums, and retention on a
versioned bucket.

AWS cannot be reached from here: moto's server on 127.0.0.1 stands in for
S3 (real HTTP, real boto3; it keeps SHA-256 checksums, composite ones for
multipart uploads, and object versions as S3 does).
"""

import os

import pytest
from regatta import manifest as mf
from regatta.storage import StorageError

from checkpoints.models import Checkpoint
from checkpoints.storage import S3Options, open_uri, verify_checkpoint
from jobs.checkpointing import open_job_storage
from jobs.checkpointing import prune as apply_retention
from tests.checkpoints.test_s3_storage import bucket, s3_job, save_checkpoint  # noqa: F401
from tests.support.aws_standin import REGION, aws, client, moto_url, unique  # noqa: F401

MIB = 1 << 20


def body_reads(storage) -> list[str]:
    """Keys whose bodies the storage's client fetches from now on."""
    reads = []
    storage.client.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: reads.append(params["Key"]))
    return reads


@pytest.mark.timeout(240)
def test_verifying_a_100_mb_checkpoint_reads_no_shard(s3_job, aws, bucket, tmp_path):  # noqa: F811
    storage = open_uri(s3_job.storage_uri, S3Options(region=REGION, endpoint_url=aws,
                                                  multipart_threshold_mb=64))
    local = tmp_path / "step-100"
    local.mkdir()
    # One multipart upload (70 MiB) and one single-part (30 MiB).
    files = {"__0_0.distcp": 70 * MIB, "__1_0.distcp": 30 * MIB}
    for name, size in files.items():
        (local / name).write_bytes(os.urandom(size))
    storage.upload_dir(local, 100, sorted(files))
    manifest = mf.build_manifest(100, mf.hash_local_files(local, sorted(files)))
    storage.write_bytes(f"step-100/{mf.MANIFEST}", manifest)
    storage.write_bytes(f"step-100/{mf.MARKER}", mf.marker_for(manifest))
    checkpoint = Checkpoint.objects.create(job=s3_job, step=100, uri=storage.step_uri(100),
                                           state="committed",
                                           manifest_sha256=mf.sha256_bytes(manifest))
    reads = body_reads(storage)

    assert verify_checkpoint(checkpoint, storage) == (True, "ok")

    # Only the manifest and the marker are read (a few hundred bytes).
    assert sorted(k.rsplit("/", 1)[-1] for k in reads) == sorted(
        [mf.MANIFEST, mf.MARKER, mf.MANIFEST])
    head = client("s3", aws).head_object(Bucket=bucket, Key="runs/gpt/step-100/__1_0.distcp",
                                         ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"]


def test_a_shard_replaced_with_a_checksummed_other_is_corrupt_unread(s3_job, aws, bucket,  # noqa: F811
                                                                      tmp_path):
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    key = "runs/gpt/step-100/trainer_state/rank-0.pt"
    client("s3", aws).put_object(Bucket=bucket, Key=key, Body=b"step=999",
                                 ChecksumAlgorithm="SHA256")  # same size, other bytes
    storage = open_job_storage(s3_job)
    reads = body_reads(storage)
    ok, reason = verify_checkpoint(checkpoint, storage)
    assert not ok and "rank-0.pt does not match its sha256" in reason
    assert not [k for k in reads if k.endswith("rank-0.pt")]


def test_an_object_without_an_s3_checksum_is_re_read(s3_job, aws, bucket, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(s3_job, 100, tmp_path)
    key = "runs/gpt/step-100/trainer_state/rank-0.pt"
    s3 = client("s3", aws)
    s3.put_object(Bucket=bucket, Key=key, Body=b"step=100")  # the same bytes, no SHA-256
    storage = open_job_storage(s3_job)
    reads = body_reads(storage)
    assert verify_checkpoint(checkpoint, storage) == (True, "ok")
    assert key in reads


def versions(aws, bucket, prefix):  # noqa: F811
    reply = client("s3", aws).list_object_versions(Bucket=bucket, Prefix=prefix)
    return reply.get("Versions", []) + reply.get("DeleteMarkers", [])


def test_retention_on_a_versioned_bucket_deletes_every_version(s3_job, aws, bucket,  # noqa: F811
                                                               tmp_path):
    s3 = client("s3", aws)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for step in (100, 200, 300):
        save_checkpoint(s3_job, step, tmp_path / str(step))
    # A file written twice and one deleted before: two versions and a marker.
    s3.put_object(Bucket=bucket, Key="runs/gpt/step-100/trainer_state/rank-0.pt", Body=b"again")
    s3.put_object(Bucket=bucket, Key="runs/gpt/step-100/scratch", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="runs/gpt/step-100/scratch")
    assert len(versions(aws, bucket, "runs/gpt/step-100/")) == 7

    assert apply_retention(s3_job, None) == [100]

    assert versions(aws, bucket, "runs/gpt/step-100/") == []
    assert len(versions(aws, bucket, "runs/gpt/step-200/")) == 4  # kept


def test_a_refused_delete_fails_loudly_and_keeps_the_row(s3_job, aws, tmp_path):  # noqa: F811
    locked = unique("locked")
    s3 = client("s3", aws)
    s3.create_bucket(Bucket=locked, ObjectLockEnabledForBucket=True)
    storage = open_uri(f"s3://{locked}/runs/gpt", S3Options(region=REGION, endpoint_url=aws))
    s3.put_object(Bucket=locked, Key="runs/gpt/step-100/a", Body=b"1")
    s3.put_object(Bucket=locked, Key="runs/gpt/step-100/b", Body=b"2",
                  ObjectLockLegalHoldStatus="ON")
    with pytest.raises(StorageError, match="1 deletes refused.*step-100/b"):
        storage.delete_step(100)
    assert [v["Key"] for v in versions(aws, locked, "runs/gpt/")] == ["runs/gpt/step-100/b"]
