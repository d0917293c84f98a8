"""The worker endpoints refuse what they cannot store or should not believe:
unknown fields, another job's id, checkpoint URIs outside the job's own
folder, and strings PostgreSQL cannot hold (NUL, lone surrogates) at any
depth; each a 400 naming every bad field, writing nothing. Everything the
trainer really sends (worker_image/trainer/reporting.py) is still taken."""

import json

import pytest

from checkpoints.models import Checkpoint
from jobs.metrics.models import MetricPoint
from jobs.models import JobEvent, RankStatus
from tests.api_factories import make_attempt, make_job, worker_client


@pytest.fixture
def job_9(team, cluster, owner):
    """Running; its own folder, /data/ckpt/vision/job-9, is what the URIs below are judged by."""
    return make_job(team, cluster, owner, phase="running", storage_uri="/data/ckpt/vision/job-9")


@pytest.fixture
def attempt_9(job_9):
    return make_attempt(job_9)


def post(attempt_token, endpoint, body):
    attempt, token = attempt_token
    return worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/{endpoint}",
                                     json.dumps(body), content_type="application/json")


def heartbeat(job, **extra):
    return {"rank": 0, "node": "cpu-a-0", "step": 5, "samples_per_s": 1.0, "tokens_per_s": 2.0,
            "step_time_s": 0.1, "gpu": {"util": 0.5}, "job_id": str(job.pk), **extra}


def checkpoint(job, **extra):
    return {"step": 200, "uri": "file:///data/ckpt/vision/job-9/step-200", "bytes": 10,
            "manifest_sha256": "ab" * 32, "save_seconds": 0.1, "blocking_seconds": 0.01,
            "emergency": False, "request_id": None, "job_id": str(job.pk), **extra}


def metrics(job, points=None, **extra):
    points = points or [{"rank": 0, "name": "loss", "step": 1, "value": 2.5, "time": 1.0}]
    return {"batch_id": "j1-a1-r0-1", "job_id": str(job.pk), "points": points, **extra}


def event(job, **extra):
    return {"kind": "started", "rank": 0, "message": "hi", "data": {"step": 1},
            "job_id": str(job.pk), **extra}


def test_every_field_the_trainer_sends_is_accepted(attempt_9, job_9):
    assert post(attempt_9, "heartbeat", heartbeat(job_9)).status_code == 200
    assert post(attempt_9, "metrics", metrics(job_9)).status_code == 200
    assert post(attempt_9, "checkpoints", checkpoint(job_9)).status_code == 201
    assert post(attempt_9, "events", event(job_9)).status_code == 201


@pytest.mark.parametrize(("endpoint", "body"), [
    ("heartbeat", heartbeat), ("metrics", metrics), ("checkpoints", checkpoint),
    ("events", event),
])
def test_unknown_fields_are_named_with_every_other_bad_field(attempt_9, job_9, endpoint, body):
    resp = post(attempt_9, endpoint, body(job_9, colour="blue", shade=1, rank="zero"))
    assert resp.status_code == 400, resp.content
    assert {"colour", "shade"} <= set(resp.data)
    assert "rank" in resp.data or endpoint == "metrics"
    assert not (RankStatus.objects.exists() or MetricPoint.objects.exists()
                or Checkpoint.objects.exists() or JobEvent.objects.exists())


def test_an_unknown_field_inside_a_metric_point_is_named(attempt_9, job_9):
    points = [{"rank": 0, "name": "loss", "step": 1, "value": 1.0, "unit": "nats"},
              {"rank": 0, "name": "", "step": 2, "value": 1.0}]
    resp = post(attempt_9, "metrics", metrics(job_9, points=points))
    assert resp.status_code == 400
    assert {"points[0].unit", "points[1].name"} <= set(resp.data)
    assert not MetricPoint.objects.exists()


@pytest.mark.parametrize("job_id", ["999999", 999999, "x"])
def test_a_body_about_another_job_is_refused(attempt_9, job_9, job_id):
    resp = post(attempt_9, "heartbeat", heartbeat(job_9, job_id=job_id))
    assert resp.status_code == 400 and "job_id" in resp.data
    assert not RankStatus.objects.exists()


@pytest.mark.parametrize("uri", [
    "../../etc/passwd", "/data/ckpt/vision/job-9/step-200/../../job-8/step-200",
    "http://evil.example/step-200", "~/x", "/data/ckpt/vision/job-9/step-200\n",
    "/data/ckpt/vision/job-8/step-200", "/data/ckpt/vision/job-9/step-201",
    "s3://bucket/data/ckpt/vision/job-9/step-200",
])
def test_a_checkpoint_outside_the_jobs_own_step_folder_is_refused(attempt_9, job_9, uri):
    resp = post(attempt_9, "checkpoints", checkpoint(job_9, uri=uri))
    assert resp.status_code == 400
    assert "/data/ckpt/vision/job-9/step-200" in str(resp.data["uri"][0])
    assert not Checkpoint.objects.exists()


@pytest.mark.parametrize("uri", ["file:///data/ckpt/vision/job-9/step-200",
                                 "/data/ckpt/vision/job-9/step-200"])
def test_a_checkpoint_in_either_spelling_of_the_jobs_folder_is_taken(attempt_9, job_9, uri):
    assert post(attempt_9, "checkpoints", checkpoint(job_9, uri=uri)).status_code == 201


def test_an_s3_job_takes_its_own_s3_step_uri(team, cluster, owner):
    job = make_job(team, cluster, owner, phase="running", storage_uri="s3://bkt/runs/vision/j")
    attempt = make_attempt(job)
    ok = post(attempt, "checkpoints", checkpoint(job, uri="s3://bkt/runs/vision/j/step-200"))
    assert ok.status_code == 201
    bad = post(attempt, "checkpoints", checkpoint(job, step=201,
                                                  uri="s3://bkt/runs/vision/k/step-201"))
    assert bad.status_code == 400


@pytest.mark.parametrize(("endpoint", "body", "where"), [
    ("heartbeat", lambda j: heartbeat(j, node="a\u0000b"), "node"),
    ("heartbeat", lambda j: heartbeat(j, gpu={"temp\u0000": 1}), "gpu."),
    ("heartbeat", lambda j: heartbeat(j, gpu={"name": "\ud800"}), "gpu.name"),
    ("metrics", lambda j: metrics(j, points=[{"rank": 0, "name": "lo\u0000ss", "step": 1,
                                              "value": 1.0}]), "points[0].name"),
    ("checkpoints", lambda j: checkpoint(j, manifest_sha256="\ud800"), "manifest_sha256"),
    ("checkpoints", lambda j: checkpoint(j, uri="/data/ckpt/vision/job-9/step-200\u0000"),
     "uri"),
    ("events", lambda j: event(j, message="\u0000"), "message"),
    ("events", lambda j: event(j, data={"deep": [{"x": "\udfff"}]}), "data.deep[0].x"),
])
def test_strings_postgres_cannot_store_are_a_400_naming_where(attempt_9, job_9, endpoint, body,
                                                              where):
    resp = post(attempt_9, endpoint, body(job_9))
    assert resp.status_code == 400, resp.content
    assert any(key.startswith(where) for key in resp.data), resp.data
    assert not (RankStatus.objects.exists() or MetricPoint.objects.exists()
                or Checkpoint.objects.exists() or JobEvent.objects.exists())


def test_a_heartbeat_marks_the_node_it_runs_on_heard_from(attempt_9, job_9, cluster):
    from clusters.models import Node
    from jobs.models import AttemptNode

    placed, elsewhere = Node.objects.get(name="cpu-a-0"), Node.objects.get(name="cpu-a-1")
    AttemptNode.objects.create(attempt=attempt_9[0], node=placed, node_rank=0)
    assert post(attempt_9, "heartbeat", heartbeat(job_9, node="cpu-a-0")).status_code == 200
    assert post(attempt_9, "heartbeat", heartbeat(job_9, rank=1, node="cpu-a-1")).status_code == 200
    placed.refresh_from_db()
    elsewhere.refresh_from_db()
    assert placed.last_heartbeat_at is not None
    # A node outside the attempt's placement is not vouched for.
    assert elsewhere.last_heartbeat_at is None
