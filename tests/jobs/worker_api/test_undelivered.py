"""Reports a rank could not deliver before it exited: the SDK hands them off
into the job's storage, and the control plane stores them once."""

import json
import socket
from pathlib import Path

import pytest
from django.utils import timezone
from regatta.reporting import Reporter
from regatta.spool import storage_handoff

from checkpoints.models import Checkpoint
from jobs.checkpointing import open_job_storage
from jobs.metrics.models import MetricPoint
from jobs.models import JobEvent, Phase, TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from jobs.worker_api.tokens import issue as issue_token
from jobs.worker_api.undelivered import collect
from tests.api_factories import make_attempt, make_job, worker_client
from tests.fleet_helpers import (
    kinds,
    later,
    launch,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)


def dead_url() -> str:
    """A loopback port nothing listens on: the web is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def job_on_disk(team, cluster, owner, tmp_path):
    """Running, with its storage in the test's own folder: the ranks hand off there."""
    return make_job(team, cluster, owner, phase="running", storage_uri=str(tmp_path / "ckpt"))


def run_with_the_web_down(job, attempt, token, steps=120, manifest_sha256="ab" * 32) -> Reporter:
    """A rank's whole run while the web is away: it exits with everything
    undelivered and hands it off."""
    reporter = Reporter(dead_url(), token, str(attempt.pk), rank=0, node="cpu-a-0",
                        heartbeat_interval_s=0.2, job_id=str(job.pk),
                        handoff=storage_handoff(job.storage_uri), max_metrics=100)
    reporter.start()
    reporter.event("started", "fresh start", {"world_size": 1})
    for step in range(1, steps + 1):
        reporter.metric("loss", step, 3.0 - step / 100)
    reporter.checkpoint({"step": steps, "uri": f"file://{job.storage_uri}/step-{steps}",
                         "bytes": 10, "manifest_sha256": manifest_sha256, "save_seconds": 0.1,
                         "blocking_seconds": 0.01, "emergency": False, "request_id": ""})
    reporter.event("finished", f"finished at step {steps}", {"step": steps})
    reporter.close(timeout_s=0.5)
    assert not reporter.dropped
    return reporter


def handed_off(job) -> list[Path]:
    return sorted((Path(job.storage_uri) / "reports").rglob("*.jsonl"))


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_what_a_rank_left_undelivered_is_stored_once_and_the_file_deleted(job_on_disk):
    attempt, token = make_attempt(job_on_disk)
    reporter = run_with_the_web_down(job_on_disk, attempt, token)
    (left,) = handed_off(job_on_disk)
    assert left.parent.name == f"attempt-{attempt.pk}" and "left at reports/" in \
        reporter.handed_off_to

    done = collect(attempt, open_job_storage(job_on_disk))

    assert done.files == 1 and not done.refused["items"]
    steps = sorted(MetricPoint.objects.filter(attempt=attempt, name="loss")
                   .values_list("step", flat=True))
    assert steps == list(range(1, 121))
    assert list(JobEvent.objects.filter(job=job_on_disk, kind__startswith="Trainer").order_by("id")
                .values_list("kind", flat=True)) == ["TrainerStarted", "TrainerFinished"]
    assert Checkpoint.objects.get(job=job_on_disk, step=120).attempt == attempt
    collected = JobEvent.objects.get(job=job_on_disk, kind="UndeliveredReportsCollected")
    assert collected.evidence["items"] > 3
    assert handed_off(job_on_disk) == []


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_reports_the_web_took_late_or_a_file_collected_twice_are_not_stored_again(job_on_disk):
    attempt, token = make_attempt(job_on_disk)
    run_with_the_web_down(job_on_disk, attempt, token)
    (left,) = handed_off(job_on_disk)
    copy = left.with_name("rank-0-again.jsonl")
    copy.write_bytes(left.read_bytes())  # as if a pass died before its delete
    # The web came back in time for the `started` event after all.
    started = next(json.loads(line)["body"] for line in left.read_text().splitlines()[1:]
                   if json.loads(line)["body"].get("kind") == "started")
    assert worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/events", started,
                                     format="json").status_code == 201

    done = collect(attempt, open_job_storage(job_on_disk))

    assert done.files == 2
    assert JobEvent.objects.filter(job=job_on_disk, kind="TrainerStarted").count() == 1
    assert JobEvent.objects.filter(job=job_on_disk, kind="TrainerFinished").count() == 1
    assert MetricPoint.objects.filter(attempt=attempt, name="loss").count() == 120
    assert Checkpoint.objects.filter(job=job_on_disk).count() == 1


@pytest.mark.django_db(transaction=True)
def test_another_attempts_file_is_left_in_place_and_a_bad_item_is_refused(job_on_disk, tmp_path):
    attempt, token = make_attempt(job_on_disk)
    other, other_token = make_attempt(job_on_disk)
    run_with_the_web_down(job_on_disk, other, other_token, steps=3)
    (theirs,) = handed_off(job_on_disk)
    mine = Path(job_on_disk.storage_uri) / "reports" / f"attempt-{attempt.pk}" / theirs.name
    mine.parent.mkdir(parents=True)
    mine.write_bytes(theirs.read_bytes())
    with theirs.open("a") as f:
        f.write('{"endpoint": "events", "body": {"kind": "Not A Kind"}}\n')

    done = collect(attempt, open_job_storage(job_on_disk))

    # The header names the other attempt: nothing of it is stored as this one's.
    assert done.files == 0 and done.refused["files"] == 1
    assert mine.exists() and not JobEvent.objects.filter(attempt=attempt).exists()
    done = collect(other, open_job_storage(job_on_disk))
    assert done.files == 1 and done.refused["items"] == 1
    assert MetricPoint.objects.filter(attempt=other).count() == 3
    assert JobEvent.objects.filter(attempt=other, kind="TrainerFinished").exists()


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_a_job_whose_end_the_web_missed_succeeds_from_what_its_ranks_handed_off(
        fleet_dirs, tmp_path):
    # The web was away while the program finished: its final checkpoint is
    # on disk, but the report of it and the `finished` event are only in the
    # file the rank left. The attempt's end is judged after collecting it.
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster), entrypoint=["/opt/code/train.py"],
                 hyperparameters={"steps": 40}, storage_uri=str(tmp_path / "ckpt"),
                 completion=TrainingJob.Completion.CHECKPOINT)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    sha = write_checkpoint(job, 40, attempt).manifest_sha256
    Checkpoint.objects.filter(job=job).delete()  # never reported
    run_with_the_web_down(job, attempt, issue_token(attempt), steps=40, manifest_sha256=sha)
    provider_of(cluster).finish(attempt.provider_ref)

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, kinds(job)
    assert "FinalCheckpointMissing" not in kinds(job)
    assert JobEvent.objects.get(job=job, kind="Succeeded").evidence["checkpoint_step"] == 40
    assert kinds(job).count("TrainerFinished") == 1
    assert MetricPoint.objects.filter(attempt=attempt).count() == 40


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_what_a_rank_left_after_its_attempt_ended_is_collected_by_the_next_attempt(
        fleet_dirs, tmp_path):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster), entrypoint=["/opt/code/train.py"],
                 hyperparameters={"steps": 40}, storage_uri=str(tmp_path / "ckpt"))
    now = timezone.now()
    launch(job, now)
    first = job.attempts.get()
    node = first.placements.order_by("node_rank").first().node.name
    provider_of(cluster).exit_node(first.provider_ref, node, exit_code=84)
    reconcile_job_unlocked(job.id, later(now, 5))
    first.refresh_from_db()
    assert first.ended_at is not None and job.attempts.count() == 2
    # The other node's rank, stopped once the attempt had ended, hands off late.
    run_with_the_web_down(job, first, issue_token(first), steps=10)

    reconcile_job_unlocked(job.id, later(now, 60))

    assert MetricPoint.objects.filter(attempt=first).count() == 10
    assert kinds(job).count("TrainerFinished") == 1 and handed_off(job) == []
