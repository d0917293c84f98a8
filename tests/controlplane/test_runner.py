"""The one reconcile runner honours the three error classes, for jobs and
for clusters: temporary → look again after its delay; permanent → a
condition, an event and the last error, and no retry until something
changes; anything else → exponential backoff with the count kept.

The provider is the in-memory test double (tests/support/memory_provider.py);
its calls are made to raise the way a real provider's would."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Cluster
from clusters.reconcile import reconcile_cluster_locked
from controlplane.lib.errors import PermanentError, TemporaryError
from controlplane.lib.runner import BACKOFF_BASE_S, PERMANENT_RECHECK_S
from jobs.admission import admit
from jobs.models import Phase
from jobs.reconcile import reconcile_job_locked, reconcile_job_unlocked
from tests.fleet_helpers import memory_cluster, submit, team_with_quota
from tests.support import memory_provider

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def admitted_job(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    reconcile_job_unlocked(job.id, now)
    admit(cluster.id, now)
    return job


def launch_raises(monkeypatch, exc):
    def launch(self, request):
        raise exc
    monkeypatch.setattr(memory_provider.MemoryProvider, "launch", launch)


def error_condition(obj):
    obj.refresh_from_db()
    return next((c for c in obj.conditions if c["type"] == "ReconcileError"), None)


def test_a_temporary_error_is_looked_at_again_after_its_own_delay(admitted_job, monkeypatch):
    launch_raises(monkeypatch, TemporaryError("API server throttled us", delay=17.0))
    now = timezone.now()

    result = reconcile_job_locked(admitted_job.id, now)

    assert result.requeue_after == 17.0
    condition = error_condition(admitted_job)
    assert condition["error_class"] == "temporary" and condition["count"] == 1
    assert admitted_job.next_reconcile_at == now + timedelta(seconds=17)
    assert "throttled" in admitted_job.last_error
    assert admitted_job.events.filter(kind="ReconcileError").count() == 1


def test_a_permanent_error_stops_the_retries_with_an_event_and_the_last_error(
        admitted_job, monkeypatch):
    launch_raises(monkeypatch, PermanentError("image pull secret regcred does not exist"))
    now = timezone.now()

    first = reconcile_job_locked(admitted_job.id, now)
    second = reconcile_job_locked(admitted_job.id, now + timedelta(seconds=1))

    assert first.requeue_after == second.requeue_after == PERMANENT_RECHECK_S
    condition = error_condition(admitted_job)
    assert condition["error_class"] == "permanent" and condition["count"] == 2
    assert admitted_job.next_reconcile_at == now + timedelta(seconds=1 + PERMANENT_RECHECK_S)
    # One event for the error, not one per pass that met it again.
    (event,) = admitted_job.events.filter(kind="ReconcileError")
    assert "regcred" in event.message and event.evidence["error_class"] == "permanent"


def test_any_other_error_backs_off_exponentially_and_a_good_pass_clears_it(
        admitted_job, monkeypatch):
    launch_raises(monkeypatch, RuntimeError("provider bug"))
    now = timezone.now()
    delays = [reconcile_job_locked(admitted_job.id, now).requeue_after for _ in range(3)]
    assert delays == [BACKOFF_BASE_S, 2 * BACKOFF_BASE_S, 4 * BACKOFF_BASE_S]
    assert error_condition(admitted_job)["count"] == 3

    monkeypatch.undo()
    reconcile_job_locked(admitted_job.id, now)

    assert error_condition(admitted_job) is None
    assert admitted_job.phase == Phase.STARTING


def test_a_cluster_whose_provider_fails_keeps_the_error_and_backs_off(db, monkeypatch):
    cluster = memory_cluster(name="mem-err")

    def list_nodes(self, pool):
        raise TemporaryError("provider API unavailable", delay=9.0)
    monkeypatch.setattr(memory_provider.MemoryProvider, "list_nodes", list_nodes)
    now = timezone.now()

    result = reconcile_cluster_locked(cluster.id, now)

    assert result.requeue_after == 9.0
    cluster = Cluster.objects.get(pk=cluster.pk)
    assert "unavailable" in cluster.last_error
    assert cluster.next_reconcile_at == now + timedelta(seconds=9)
    assert error_condition(cluster)["error_class"] == "temporary"

    monkeypatch.undo()
    reconcile_cluster_locked(cluster.id, now)
    cluster.refresh_from_db()
    assert cluster.last_error == "" and error_condition(cluster) is None


def test_a_cluster_with_a_bad_setting_is_a_permanent_error_naming_it(db):
    cluster = memory_cluster(name="mem-bad")
    Cluster.objects.filter(pk=cluster.pk).update(settings={"observe_interval_s": "soon"})

    result = reconcile_cluster_locked(cluster.id, timezone.now())

    assert result.requeue_after == PERMANENT_RECHECK_S
    cluster.refresh_from_db()
    assert "observe_interval_s" in cluster.last_error


def test_a_job_asked_for_during_its_pass_gets_one_more_pass_right_after(admitted_job,
                                                                        monkeypatch):
    # Another worker asks for the job while this one's pass launches it: its
    # ask finds the lock held. It used to be dropped, and a change it came
    # for (an admission during the pass that queued the job) waited for the
    # job's next due time; now the holder asks for one more pass at once,
    # and only once.
    asks = []
    launch = memory_provider.MemoryProvider.launch

    def launch_while_asked(self, request):
        asks.append(reconcile_job_locked(admitted_job.id, timezone.now()))
        return launch(self, request)

    monkeypatch.setattr(memory_provider.MemoryProvider, "launch", launch_while_asked)
    result = reconcile_job_locked(admitted_job.id, timezone.now())

    assert asks == [None]  # the ask found the job held
    assert result.requeue_after == 0.0 and "asked for again" in result.note
    monkeypatch.setattr(memory_provider.MemoryProvider, "launch", launch)
    after = reconcile_job_locked(admitted_job.id, timezone.now())
    assert "asked for again" not in after.note


def test_a_cluster_asked_for_during_its_pass_is_left_to_the_next_sweep(db, monkeypatch):
    cluster = memory_cluster()
    asks = []
    list_nodes = memory_provider.MemoryProvider.list_nodes

    def list_while_asked(self, *args, **kwargs):
        if not asks:
            asks.append(reconcile_cluster_locked(cluster.id, timezone.now()))
        return list_nodes(self, *args, **kwargs)

    monkeypatch.setattr(memory_provider.MemoryProvider, "list_nodes", list_while_asked)
    result = reconcile_cluster_locked(cluster.id, timezone.now())

    assert asks == [None]
    assert "asked for again" not in result.note
