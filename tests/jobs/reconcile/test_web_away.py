"""A web restart is not a hang: the ranks' silence counts only while a web
process is listening (controlplane/lib/receiver.py), so a job whose
heartbeats could not be heard keeps running instead of being restarted."""

import time

import pytest
from django.utils import timezone

from controlplane.lib import receiver
from jobs.models import Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    later,
    memory_cluster,
    running_job,
    team_with_quota,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(heartbeat_deadline_s=10.0)


def _running(mem_cluster, now):
    return running_job(mem_cluster, team_with_quota(mem_cluster), now)


def _web_marked(at):
    """A web process's marks, the last one at `at`."""
    receiver.mark(at.timestamp() - 2 * receiver.GAP_S)  # an earlier, unbroken run
    receiver.mark(at.timestamp())


def test_no_hang_is_called_while_no_web_is_listening(mem_cluster):
    now = timezone.now()
    job, attempt = _running(mem_cluster, now)
    _web_marked(later(now, 2))  # then the web went away
    # 30 s of silence against a 10 s deadline, all of it with no web to hear.
    reconcile_job_unlocked(job.id, later(now, 31))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.RUNNING and attempt.failure_class == ""


def test_silence_counts_from_the_moment_the_web_is_back(mem_cluster):
    now = timezone.now()
    job, attempt = _running(mem_cluster, now)
    back = later(now, 40)
    receiver.mark(back.timestamp())  # the first mark after the outage starts a run
    receiver.mark(later(now, 44).timestamp())
    # 44 s since the last beat, but the web has been back for 5 s only.
    reconcile_job_unlocked(job.id, later(now, 45))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    # Back for 12 s and still silent: now it is the ranks.
    for at in (48, 52):
        receiver.mark(later(now, at).timestamp())
    reconcile_job_unlocked(job.id, later(now, 52))
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"


def test_with_no_web_marks_at_all_the_deadline_counts_as_before(mem_cluster):
    now = timezone.now()
    job, attempt = _running(mem_cluster, now)
    reconcile_job_unlocked(job.id, later(now, 20))
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"


def test_a_web_process_marks_while_it_lives_and_stops_when_told(broker):
    before = time.time()
    stop = receiver.start_marking()
    try:
        assert receiver.start_marking() is stop  # one marking thread a process
        def marked():
            known, since = receiver.listening(time.time())
            return known and since is not None and since >= before - 1

        eventually(marked, timeout=10, interval=0.1, what="a mark from the marking thread")
    finally:
        stop.set()
    assert receiver.listening(time.time() + 10 * receiver.GAP_S) == (True, None)


def test_importing_the_wsgi_application_starts_no_marking(broker):
    """Only the server's factory marks: a test or a tool that imports the
    application must not make every later reconcile think a web listens."""
    import threading

    from controlplane import wsgi  # noqa: F401

    def marking():
        return [t for t in threading.enumerate()
                if t.name == "regatta-web-liveness" and t.is_alive()]

    # A thread an earlier test stopped ends within its wait; one an import
    # started would mark for ever.
    eventually(lambda: not marking(), timeout=2 * receiver.MARK_EVERY_S + 1, interval=0.05,
               what="no marking thread")
