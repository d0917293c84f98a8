"""A Celery worker SIGKILLed in the middle of a reconcile loses nothing: the
next sweep, on another worker, finishes the work once the lock's TTL ends.

The pause comes from the REGATTA_TEST_PAUSE hook (jobs/reconcile/common.py):
the first pass that reaches "launch" — after the attempt row is written,
before the ranks are launched — sleeps, and the test kills the worker there.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from jobs.models import Phase

from .conftest import Sweeper, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def start_worker(env, log):
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo",
         "--concurrency=1", "--without-mingle", "--without-gossip", "--loglevel=WARNING"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def kill(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_reconcile_loses_nothing_and_the_next_sweep_finishes(
        fleet_env, tmp_path):
    marker = tmp_path / "paused"
    env = subprocess_env(fleet_env, REGATTA_TEST_PAUSE=f"launch:120:{marker}",
                         REGATTA_LOCK_TTL_S=3)
    cluster = fleet_env.cluster()
    log = open(tmp_path / "workers.log", "ab")
    first = start_worker(env, log)
    second = None
    try:
        with Sweeper():
            job = fleet_env.submit(cluster, max_steps=400, step_sleep_s=0.1)
            fleet_env.wait("the first worker paused inside the reconcile", marker.exists,
                           timeout=90, job=job)
            attempt = job.attempts.get()
            assert attempt.state == "preflight" and attempt.provider_ref == {}
            kill(first)
            time.sleep(0.5)
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
