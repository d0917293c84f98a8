"""Retention on the control plane's side (jobs/checkpointing/ over
checkpoints/storage.py), the one owner of deletion while a
trainer reports to it: real checkpoint folders on the filesystem (the S3
side is in test_s3_storage.py), rows as the worker API leaves them."""

from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from checkpoints.models import Checkpoint
from checkpoints.storage import retention_plan
from jobs import tasks
from jobs.checkpointing import protected_steps
from jobs.checkpointing import prune as apply_retention
from jobs.models import JobAttempt, TrainingJob
from tests.fleet_helpers import memory_cluster, submit, team_with_quota, write_checkpoint

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def job_keeping_one(db):
    """Running on the in-memory fleet, keeping its last checkpoint only."""
    cluster = memory_cluster()
    return submit(cluster, team_with_quota(cluster), keep_last=1, phase="running")


def folder(checkpoint) -> Path:
    return Path(checkpoint.uri.removeprefix("file://"))


def states(job) -> dict[int, str]:
    return dict(Checkpoint.objects.filter(job=job).values_list("step", "state"))


def test_it_keeps_the_checkpoint_a_restart_request_resolves_to(job_keeping_one):
    rows = {step: write_checkpoint(job_keeping_one, step) for step in (100, 200, 300, 400)}
    # No checkpoint at 250: the restart resumes from the newest one below it.
    job_keeping_one.request_restart(250, "user:olivia")

    assert apply_retention(job_keeping_one, timezone.now()) == [100, 300]
    assert states(job_keeping_one) == {100: "deleted", 200: "committed", 300: "deleted",
                                       400: "committed"}
    assert folder(rows[200]).is_dir() and not folder(rows[100]).exists()


def test_it_keeps_the_resume_point_of_an_attempt_still_starting(job_keeping_one):
    for step in (100, 200, 300):
        write_checkpoint(job_keeping_one, step)
    JobAttempt.objects.create(job=job_keeping_one, number=1, state=JobAttempt.State.STARTING,
                              resume_step=100)
    JobAttempt.objects.create(job=job_keeping_one, number=0, state=JobAttempt.State.FAILED,
                              resume_step=200)

    keep, delete = retention_plan(job_keeping_one, protected_steps(job_keeping_one))
    assert sorted(c.step for c in keep) == [100, 300]
    assert [c.step for c in delete] == [200]


def test_it_never_deletes_the_newest_verified_one_however_old(job_keeping_one):
    rows = {step: write_checkpoint(job_keeping_one, step) for step in (5, 10, 15, 20)}
    Checkpoint.objects.filter(pk=rows[5].pk).update(state=Checkpoint.State.VERIFIED)

    assert apply_retention(job_keeping_one, timezone.now()) == [10, 15]
    assert folder(rows[5]).is_dir() and folder(rows[20]).is_dir()
    assert not folder(rows[10]).exists() and not folder(rows[15]).exists()


def test_the_sweep_registers_and_prunes_checkpoints_whose_reports_were_lost(job_keeping_one):
    rows = {step: write_checkpoint(job_keeping_one, step) for step in (5, 10, 15)}
    # The ranks that would have reported 5 and 10 died first: only files remain.
    Checkpoint.objects.filter(step__in=(5, 10)).delete()

    tasks.sweep_retention()

    assert states(job_keeping_one) == {5: "deleted", 10: "deleted", 15: "committed"}
    assert not folder(rows[5]).exists() and not folder(rows[10]).exists()
    assert folder(rows[15]).is_dir()
    (event,) = job_keeping_one.events.filter(kind="CheckpointsDeleted")
    assert event.evidence["steps"] == [5, 10]


def test_the_sweep_prunes_jobs_that_have_ended(job_keeping_one):
    for step in (5, 10, 15):
        write_checkpoint(job_keeping_one, step)
    TrainingJob.objects.filter(pk=job_keeping_one.pk).update(phase="succeeded", keep_last=2)

    tasks.sweep_retention()

    assert states(job_keeping_one) == {5: "deleted", 10: "committed", 15: "committed"}


def test_a_checkpoint_row_is_deleted_only_with_its_files(job_keeping_one):
    rows = {step: write_checkpoint(job_keeping_one, step) for step in (5, 10)}
    apply_retention(job_keeping_one, timezone.now())

    gone = Checkpoint.objects.get(pk=rows[5].pk)
    assert gone.state == Checkpoint.State.DELETED and not folder(gone).exists()
    assert apply_retention(job_keeping_one, timezone.now()) == []  # a second pass changes nothing


def test_the_retention_sweep_is_on_the_beat_schedule_with_an_expiry():
    entries = [e for e in settings.CELERY_BEAT_SCHEDULE.values()
               if e["task"] == "jobs.tasks.sweep_retention"]
    assert len(entries) == 1 and entries[0]["options"]["expires"] > 0
