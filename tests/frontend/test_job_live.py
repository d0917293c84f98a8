"""The job page's live poll, which every open job page sends every few
seconds: a poll that finds nothing new reads the job's row and a handful of
queries, and renders nothing but the status line; anything a table shows
changes the revision, and its next poll renders the tables again."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints.models import Checkpoint
from frontend import jobdetail
from jobs.models import JobAttempt, JobEvent, Phase
from jobs.profiling.models import ProfileTrace

from .factories import checkpoint, goodput, make_job, metrics, run

TABLES = {"job-attempts", "job-checkpoints", "job-events", "job-goodput", "job-profiles"}


def _poll(client, job, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(f"/jobs/{job.pk}/live/?{query}")
    assert resp.status_code == 200
    return resp.json(), len(ctx.captured_queries)


@pytest.fixture
def running(team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.filter(is_spare=False)[:2]))
    metrics(job, attempt, "loss", range(0, 200, 10))
    checkpoint(job, attempt, 100)
    goodput(job, attempt, "productive", 0.5, key="attempt-1")
    return job, attempt


def test_a_poll_that_finds_nothing_new_costs_a_handful_of_queries(web, owner, running):
    job, _ = running
    client = web(owner)
    first, full = _poll(client, job)
    assert TABLES <= set(first["fragments"]) and "charts" in first
    again, queries = _poll(client, job, rev=first["rev"], charts_key=first["charts_key"])
    # Session, user, the job's row (team and cluster joined), the stamps,
    # the newest attempt and the membership check behind the actions.
    assert queries <= 6, f"{queries} queries for a poll that found nothing new (full: {full})"
    assert set(again["fragments"]) == {"job-status", "job-actions"}
    assert "charts" not in again and again["rev"] == first["rev"]
    assert again["step"] == job.current_step and again["phase"] == "running"


def test_the_status_line_follows_every_heartbeat_without_the_tables(web, owner, running):
    job, _ = running
    client = web(owner)
    first, _ = _poll(client, job)
    job.current_step = 190
    job.progress = {"tokens_per_s": 12345.0}
    job.save(update_fields=["current_step", "progress"])
    again, _ = _poll(client, job, rev=first["rev"], charts_key=first["charts_key"])
    assert again["rev"] == first["rev"]
    assert "190" in again["fragments"]["job-status"]
    assert "12345" in again["fragments"]["job-status"]
    # The series moved on with the step: the charts are read again.
    assert "charts" in again and again["charts_key"] != first["charts_key"]


def _new_event(job, attempt):
    JobEvent.objects.create(job=job, attempt=attempt, kind="CheckpointNow",
                            message="operator asked for a checkpoint")


def _verified_in_place(job, attempt):
    ckpt = checkpoint(job, attempt, 200, state=Checkpoint.State.COMMITTED)
    return lambda: Checkpoint.objects.filter(pk=ckpt.pk).update(
        state=Checkpoint.State.VERIFIED, verified_at=timezone.now())


CHANGES = {
    "an event": lambda job, attempt: _new_event(job, attempt),
    "a checkpoint deleted by retention": lambda job, attempt: Checkpoint.objects.filter(
        job=job).update(state=Checkpoint.State.DELETED),
    "a checkpoint found corrupt": lambda job, attempt: Checkpoint.objects.filter(
        job=job).update(state=Checkpoint.State.CORRUPT, state_reason="shard 3 mismatch"),
    "goodput accrued in place": lambda job, attempt: job.goodput.update(seconds=9999.0),
    "a profile": lambda job, attempt: ProfileTrace.objects.create(
        job=job, attempt=attempt, request_id="p1", start_step=10, steps=2, rank=0,
        path="profiles/p1/rank-0.json"),
    "the newest attempt's preflight": lambda job, attempt: JobAttempt.objects.filter(
        pk=attempt.pk).update(preflight={"ok": False, "allreduce_gbps": 0.01}),
    "an eval run's event": lambda job, attempt: _new_event(
        make_job(job.team, job.cluster, name="eval", parent=job, kind="eval", eval_step=100),
        None),
    "the job's pending reason": lambda job, attempt: type(job).objects.filter(
        pk=job.pk).update(pending_reason="needs 8 GPUs"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_anything_a_table_shows_changes_the_revision(web, owner, running, change):
    job, attempt = running
    client = web(owner)
    first, _ = _poll(client, job)
    CHANGES[change](job, attempt)
    again, _ = _poll(client, job, rev=first["rev"], charts_key=first["charts_key"])
    assert again["rev"] != first["rev"]
    assert TABLES <= set(again["fragments"])


def test_a_checkpoint_verified_in_place_changes_the_revision(web, owner, running):
    job, attempt = running
    verify = _verified_in_place(job, attempt)
    client = web(owner)
    first, _ = _poll(client, job)
    verify()
    again, _ = _poll(client, job, rev=first["rev"])
    assert again["rev"] != first["rev"]


def test_the_revision_turns_over_with_time_so_relative_times_stay_fresh(running):
    job, _ = running
    now = timezone.now()
    rev, _ = jobdetail.revision(job, now)
    later = now + timedelta(seconds=jobdetail.REVISION_PERIOD_S)
    assert jobdetail.revision(job, later)[0] != rev


def test_a_finished_job_is_answered_from_its_revision(web, owner, running):
    job, attempt = running
    JobAttempt.objects.filter(pk=attempt.pk).update(state="succeeded",
                                                    ended_at=timezone.now())
    job.transition(Phase.SUCCEEDED, reason="Succeeded")
    client = web(owner)
    first, _ = _poll(client, job)
    assert first["terminal"]
    again, queries = _poll(client, job, rev=first["rev"], charts="0")
    assert queries <= 6 and "charts" not in again
