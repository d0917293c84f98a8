"""A reconcile pass keeps its job's lock however long it runs, and a pass that
lost the lock anyway stops before acting. On the real Redis."""

import threading
import time

import pytest
from django.utils import timezone

from controlplane.lib import locks
from controlplane.redis_client import get_redis
from jobs.admission import admit
from jobs.models import JobAttempt, Phase
from jobs.reconcile import reconcile_job_locked, reconcile_job_unlocked
from tests.fleet_helpers import kinds, memory_cluster, provider_of, submit, team_with_quota
from tests.support.pauses import pause_at

pytestmark = [pytest.mark.usefixtures("fleet_dirs"), pytest.mark.timeout(60)]

# Short enough to outlive in a test, long enough that a loaded machine's
# scheduling delays never cost a renewal (see the first test).
LEASE_TTL_S = 3.0
PAST_TTL_S = 4.0


def in_thread(target):
    """Run `target` beside the pass; its exception, if any, fails the test."""
    failure = []

    def run():
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failure


def test_a_lock_held_past_its_ttl_stays_with_its_holder():
    # A TTL of 3 s: the lease renews every second, and a renewal may come up to
    # 2 s late before the lock is lost. With a TTL of 1 s the SQLite pass (at
    # nice 10 beside the whole suite on two cores) once starved the lease
    # thread past its 0.67 s of slack.
    with locks.hold("test:long", ttl_s=LEASE_TTL_S) as got:
        assert got
        time.sleep(PAST_TTL_S)  # not a wait: the TTL must run out
        with locks.hold("test:long") as other:
            assert other is False
        locks.ensure_held()
    assert not locks.is_held("test:long")


def test_a_pass_longer_than_the_ttl_keeps_other_workers_out(db, settings):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    ready_to_launch(job)
    settings.RECONCILE_LOCK_TTL_S = LEASE_TTL_S
    seen = []

    with pause_at("launch") as pause:
        # The pass stops after preflight, as a long preflight check would keep it.
        def second_worker():
            pause.wait_reached()
            # Not a wait: the TTL must run out while the pass holds the lock.
            time.sleep(PAST_TTL_S)  # the pass has now run past the TTL it started with
            with locks.hold(f"job:{job.id}") as got:
                seen.append(got)
            pause.resume.set()

        thread, failure = in_thread(second_worker)
        result = reconcile_job_locked(job.id, timezone.now())
        thread.join(timeout=30)

    assert not failure, failure
    assert seen == [False]
    assert result is not None
    job.refresh_from_db()
    assert job.phase == Phase.STARTING and kinds(job).count("Launched") == 1
    assert not locks.is_held(f"job:{job.id}")


def test_a_pass_that_lost_its_lock_stops_before_launching(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    ready_to_launch(job)
    key = locks.PREFIX + f"job:{job.id}"

    with pause_at("launch") as pause:
        def take_over():
            # What a worker sees once the pass's process froze past the TTL: the
            # lock expired and another worker took it.
            pause.wait_reached()
            get_redis().set(key, "another-worker", px=60_000)
            pause.resume.set()

        thread, failure = in_thread(take_over)
        result = reconcile_job_locked(job.id, timezone.now())
        thread.join(timeout=30)

    assert not failure, failure
    assert result is None  # as if another worker had held the job all along
    attempt = job.attempts.get()
    assert attempt.state == JobAttempt.State.PREFLIGHT and attempt.provider_ref == {}
    assert not [c for c in provider_of(cluster).fleet.calls if c[0] == "launch"]
    assert "Launched" not in kinds(job)
    # The lock is the new holder's still: the stopped pass did not release it.
    assert get_redis().get(key) == b"another-worker"
    get_redis().delete(key)


def ready_to_launch(job) -> None:
    """Queued and admitted: the job's next pass launches it."""
    now = timezone.now()
    reconcile_job_unlocked(job.id, now)
    admit(job.cluster_id, now)
