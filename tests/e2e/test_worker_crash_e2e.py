"""A Celery worker SIGKILLed in the middle of a reconcile loses nothing: the
next sweep, on another worker, finishes the work once the lock's TTL ends.

The pause comes from a worker that listens to the reconcile's launch points
(jobs/signals.py, tests/support/paused_worker.py): the first pass that
reaches the named point stops there, and the test kills the worker: at
"launch" (the attempt row written, nothing launched) or at "launched" (the
ranks running, the row not saying so yet).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.models import Phase

from .conftest import Sweeper, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]


WORKER_ARGS = ["--pool=solo", "--concurrency=1", "--without-mingle", "--without-gossip",
               "--loglevel=WARNING"]


def start_worker(env, log, pause_at=None):
    """A real worker; with `pause_at` = (point, marker), one that stops there."""
    if pause_at is None:
        argv = [sys.executable, "-m", "celery", "-A", "controlplane", "worker", *WORKER_ARGS]
    else:
        argv = [sys.executable, "-m", "tests.support.paused_worker", *map(str, pause_at),
                *WORKER_ARGS]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=REPO)


def kill(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_reconcile_loses_nothing_and_the_next_sweep_finishes(
        fleet_env, tmp_path):
    marker = tmp_path / "paused"
    env = subprocess_env(fleet_env, REGATTA_LOCK_TTL_S=3)
    cluster = fleet_env.cluster()
    log = open(tmp_path / "workers.log", "ab")
    first = start_worker(env, log, pause_at=("launch", marker))
    second = None
    try:
        with Sweeper():
            job = fleet_env.submit(cluster, max_steps=400, step_sleep_s=0.1)
            fleet_env.wait("the first worker paused inside the reconcile", marker.exists,
                           timeout=90, job=job)
            attempt = job.attempts.get()
            assert attempt.state == "preflight" and attempt.provider_ref == {}
            kill(first)  # returns once the worker has exited: nothing more to wait for
            second = start_worker(env, log)

            def running():
                job.refresh_from_db()
                return job.phase == Phase.RUNNING
            fleet_env.wait("the job running after the crash", running, timeout=150, job=job)
            assert job.attempts.count() == 1  # the half-done attempt was finished, not doubled
            assert job.events.filter(kind="Launched").count() == 1
            attempt.refresh_from_db()
            assert attempt.provider_ref["nodes"]
            job.request_cancel("test")
            from jobs import tasks

            tasks.reconcile_job.delay(job.id)

            def cancelled():
                job.refresh_from_db()
                return job.phase == Phase.CANCELLED
            fleet_env.wait("the job cancelled", cancelled, timeout=60, job=job)
    finally:
        kill(first)
        if second is not None:
            kill(second)
        log.close()


@pytest.mark.timeout(300)
def test_ranks_launched_by_a_worker_killed_before_recording_them_are_adopted(
        fleet_env, tmp_path, settings):
    marker = tmp_path / "paused"
    env = subprocess_env(fleet_env, REGATTA_LOCK_TTL_S=3)
    cluster = fleet_env.cluster()
    log = open(tmp_path / "workers.log", "ab")
    first = start_worker(env, log, pause_at=("launched", marker))
    second = None
    try:
        with Sweeper():
            job = fleet_env.submit(cluster, max_steps=2000, step_sleep_s=0.1)
            fleet_env.wait("the first worker paused after launching", marker.exists,
                           timeout=90, job=job)
            attempt = job.attempts.get()
            assert attempt.state == "preflight" and attempt.provider_ref == {}
            ref = json.loads((settings.LOCAL_FLEET_DIR / cluster.name / "attempts"
                              / f"job-{job.id}-a1" / "ref.json").read_text())
            kill(first)
            second = start_worker(env, log)

            def adopted():
                attempt.refresh_from_db()
                return attempt.provider_ref
            fleet_env.wait("the next pass recording the launch", adopted, timeout=60, job=job)
            # The ranks the dead worker started, not a second gang.
            assert attempt.provider_ref["nodes"] == ref["nodes"]
            assert job.attempts.count() == 1
            assert job.events.filter(kind="Launched").count() == 1
            attempt.refresh_from_db()
            # Checkpoints the ranks wrote meanwhile are their own work, not
            # where they started from.
            assert attempt.resume_step is None
            assert not job.events.filter(kind="ResumedFromCheckpoint").exists()
            step = attempt.last_step

            def reports_still_accepted():
                attempt.refresh_from_db()
                return attempt.last_step >= step + 20
            # Refused reports would freeze the step here until the attempt was
            # booked as a hang.
            fleet_env.wait("the adopted ranks' reports accepted", reports_still_accepted,
                           timeout=60, job=job)

            # The job's own pass (on the second worker, every sweep) books
            # the first step it sees; reports are accepted by the web before.
            def running():
                job.refresh_from_db()
                return job.phase == Phase.RUNNING
            fleet_env.wait("the job running on the adopted ranks", running, timeout=60, job=job)
            assert not job.events.filter(kind__in=["Restarting", "Failed", "NodeFailed"])
            for node in range(2):
                out = (Path(ref["dir"]) / f"node-{node}" / "stdout.log").read_text()
                assert "refused" not in out, out[-2000:]
            job.request_cancel("test")
            from jobs import tasks

            tasks.reconcile_job.delay(job.id)

            def cancelled():
                job.refresh_from_db()
                return job.phase == Phase.CANCELLED
            fleet_env.wait("the job cancelled", cancelled, timeout=60, job=job)
    finally:
        kill(first)
        if second is not None:
            kill(second)
        log.close()
