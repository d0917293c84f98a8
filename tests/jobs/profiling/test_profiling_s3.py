"""Profiler traces in S3: a rank's trace written through the worker's S3
storage is reported under the job's S3 prefix and streamed to the team
(moto's server on 127.0.0.1 stands in for S3)."""

import gzip
import json

import pytest
from regatta.storage import profile_key

from jobs.profiling import requests as profile_requests
from jobs.profiling.models import ProfileTrace
from tests.api_factories import make_attempt, worker_client
from tests.checkpoints.test_s3_storage import bucket, s3_job  # noqa: F401
from tests.conftest import client_for
from tests.profile_factories import TRACE, write_trace
from tests.support.aws_standin import aws, client, moto_url  # noqa: F401


@pytest.fixture
def member(s3_job, django_user_model):  # noqa: F811
    user = django_user_model.objects.create_user("nora", password="pw")
    s3_job.team.members.add(user)
    return user


def test_an_s3_trace_is_reported_under_the_job_s_prefix_and_streamed(
        s3_job, member, aws, bucket):  # noqa: F811
    attempt, token = make_attempt(s3_job)
    profile_requests.request(attempt, 3, "user:nora")
    key = profile_key(7, attempt.profile_request_id, 1)
    data = gzip.compress(json.dumps(TRACE).encode())
    client("s3", aws).put_object(Bucket=bucket, Key=f"runs/gpt/{key}", Body=data)
    body = {"request_id": attempt.profile_request_id, "rank": 1, "start_step": 7, "steps": 3,
            "bytes": len(data)}
    report = worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/profiles",
                                       {**body, "uri": f"s3://{bucket}/runs/gpt/{key}"},
                                       format="json")
    elsewhere = worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/profiles",
                                          {**body, "uri": f"s3://{bucket}/runs/other/{key}"},
                                          format="json")

    assert report.status_code == 201, report.content
    assert elsewhere.status_code == 400 and "uri" in elsewhere.json()
    trace = ProfileTrace.objects.get(attempt=attempt)
    resp = client_for(member).get(f"/api/v1/jobs/{s3_job.pk}/profiles/{trace.pk}/file")
    assert resp.status_code == 200 and resp.streaming
    assert json.loads(gzip.decompress(b"".join(resp.streaming_content))) == TRACE


def test_a_trace_gone_from_s3_is_404_and_an_unreachable_bucket_503(
        s3_job, member, aws, bucket):  # noqa: F811
    attempt, _ = make_attempt(s3_job)
    trace = write_trace(attempt, 0)
    url = f"/api/v1/jobs/{s3_job.pk}/profiles/{trace.pk}/file"
    client("s3", aws).delete_object(Bucket=bucket, Key=f"runs/gpt/{trace.path}")
    assert client_for(member).get(url).status_code == 404
    s3_job.cluster.settings = {**s3_job.cluster.settings, "s3_endpoint_url": "http://127.0.0.1:9",
                            "s3_max_attempts": 1}
    s3_job.cluster.save()
    assert client_for(member).get(url).status_code == 503
