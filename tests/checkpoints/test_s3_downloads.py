"""A checkpoint in S3 is downloaded through the API as the object's body
streams in (moto's server on 127.0.0.1 stands in for S3)."""

import hashlib

import pytest

from tests.checkpoints.test_s3_storage import bucket, s3_job, save_checkpoint  # noqa: F401
from tests.conftest import client_for
from tests.support.aws_standin import aws, client, moto_url  # noqa: F401


@pytest.fixture
def member(s3_job, django_user_model):  # noqa: F811
    user = django_user_model.objects.create_user("nora", password="pw")
    s3_job.team.members.add(user)
    return user


def test_an_s3_checkpoint_s_files_are_listed_and_streamed(s3_job, member, aws, bucket,  # noqa: F811
                                                          tmp_path):
    checkpoint = save_checkpoint(s3_job, 10, tmp_path, big=True)
    api = client_for(member)
    files = {f["path"]: f for f in
             api.get(f"/api/v1/checkpoints/{checkpoint.pk}/files/").json()["files"]}
    assert set(files) == {"__0_0.distcp", "trainer_state/rank-0.pt", "manifest.json",
                          "COMMITTED"}
    resp = api.get(f"/api/v1/checkpoints/{checkpoint.pk}/files/__0_0.distcp")
    assert resp.status_code == 200 and resp.streaming
    data = b"".join(resp.streaming_content)
    stored = client("s3", aws).get_object(Bucket=bucket, Key="runs/gpt/step-10/__0_0.distcp")
    assert data == stored["Body"].read()
    assert len(data) > 5 << 20  # more than one read of the body
    assert resp["Content-Length"] == str(len(data)) == str(files["__0_0.distcp"]["bytes"])
    assert hashlib.sha256(data).hexdigest() == files["__0_0.distcp"]["sha256"]
    assert resp["Content-Disposition"] == 'attachment; filename="__0_0.distcp"'


def test_an_s3_key_outside_the_step_is_never_read(s3_job, member, aws, bucket,  # noqa: F811
                                                  tmp_path):
    checkpoint = save_checkpoint(s3_job, 10, tmp_path)
    client("s3", aws).put_object(Bucket=bucket, Key="runs/gpt/secret.txt", Body=b"hidden-bytes")
    client("s3", aws).put_object(Bucket=bucket, Key="runs/gpt/step-10/unlisted.bin",
                                 Body=b"hidden-bytes")
    api = client_for(member)
    for path in ("../secret.txt", "unlisted.bin", "/runs/gpt/secret.txt"):
        resp = api.get(f"/api/v1/checkpoints/{checkpoint.pk}/files/{path}")
        assert resp.status_code == 404, path
        assert b"hidden-bytes" not in resp.content


def test_an_object_gone_from_s3_is_not_found(s3_job, member, aws, bucket, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(s3_job, 10, tmp_path)
    client("s3", aws).delete_object(Bucket=bucket, Key="runs/gpt/step-10/__0_0.distcp")
    resp = client_for(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/files/__0_0.distcp")
    assert resp.status_code == 404


def test_an_unreachable_bucket_is_503_not_500(s3_job, member, tmp_path):  # noqa: F811
    checkpoint = save_checkpoint(s3_job, 10, tmp_path)
    s3_job.cluster.settings = {**s3_job.cluster.settings, "s3_endpoint_url": "http://127.0.0.1:9",
                            "s3_max_attempts": 1}
    s3_job.cluster.save()
    resp = client_for(member).get(f"/api/v1/checkpoints/{checkpoint.pk}/files/")
    assert resp.status_code == 503
