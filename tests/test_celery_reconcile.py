"""The reconcile locks and the requeue guard, on the real Redis."""

import time

import pytest
from django.utils import timezone

from controlplane.lib import locks
from jobs.models import Phase
from jobs.reconcile import reconcile_job_locked
from tests.fleet_helpers import memory_cluster, submit, team_with_quota
from tests.support.waiting import eventually


def test_a_lock_is_held_by_one_holder_at_a_time():
    with locks.hold("test:one") as first:
        with locks.hold("test:one") as second:
            assert first is True and second is False
    with locks.hold("test:one") as again:
        assert again is True


def test_a_lock_whose_holder_died_frees_itself_after_its_ttl():
    from controlplane.redis_client import get_redis

    # A holder that never releases: a worker SIGKILLed mid-pass.
    get_redis().set(locks.PREFIX + "test:dead", "someone", px=300)
    with locks.hold("test:dead") as got:
        assert got is False
    eventually(lambda: not locks.is_held("test:dead"), what="the dead holder's TTL")
    with locks.hold("test:dead") as got:
        assert got is True


def test_releasing_never_frees_a_lock_taken_over_by_another_holder():
    from controlplane.redis_client import get_redis

    with locks.hold("test:over", ttl_s=0.2) as got:
        assert got
        # As if our process had frozen past the TTL and another worker had
        # taken the lock meanwhile.
        get_redis().set(locks.PREFIX + "test:over", "other", px=5000)
    assert get_redis().get(locks.PREFIX + "test:over") == b"other"
    get_redis().delete(locks.PREFIX + "test:over")


def test_a_short_requeue_is_claimed_once_per_window():
    assert locks.once_within("test:requeue", 0.3) is True
    assert locks.once_within("test:requeue", 0.3) is False
    # Claimed again once the window has passed, not before.
    started = time.monotonic()
    eventually(lambda: locks.once_within("test:requeue", 0.3), what="the window to pass")
    assert time.monotonic() - started >= 0.2


@pytest.mark.usefixtures("fleet_dirs")
def test_a_job_held_by_another_worker_is_left_alone(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    with locks.hold(f"job:{job.id}"):
        assert reconcile_job_locked(job.id, timezone.now()) is None
    job.refresh_from_db()
    assert job.phase == Phase.PENDING
    assert reconcile_job_locked(job.id, timezone.now()) is not None
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED  # its own pass moved it on; admission is the cluster's
    assert job.next_reconcile_at is not None
