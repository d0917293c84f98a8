"""A launched attempt that shows nothing says what its ranks are doing
(jobs/reconcile/startup.py): on the local fleet, with real torchrun ranks, a
job whose rank 1 never gets past its imports while rank 0 waits for it in
the rendezvous gets a StartupReport event naming both, after the cluster's
`startup_report_after_s`, once per change of the account."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.models import Cluster, NodePool
from clusters.providers import get_provider
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobEvent
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import launch, submit, team_with_quota
from tests.support.local_fleet import kill_everything
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.usefixtures("fleet_dirs")]

STALLED = str(Path(__file__).resolve().parents[2] / "support" / "stalled_ranks.py")


@pytest.fixture
def lab_cluster(db, tmp_path):
    lab_cluster = Cluster.objects.create(
        name="lab", provider=Cluster.Provider.LOCAL,
        settings={"fleet_dir": str(tmp_path / "fleet"), "preflight": False,
                  "startup_report_after_s": 60.0},
    )
    NodePool.objects.create(cluster=lab_cluster, name="cpu", gpus_per_node=2, size=1,
                            spare_count=0)
    reconcile_cluster_unlocked(lab_cluster.id, timezone.now())
    try:
        yield lab_cluster
    finally:
        kill_everything(get_provider(lab_cluster).root)


def reports(job) -> list[JobEvent]:
    return list(job.events.filter(kind="StartupReport").order_by("id"))


def test_a_start_up_that_shows_nothing_gets_an_event_saying_what_each_rank_does(lab_cluster):
    job = submit(lab_cluster, team_with_quota(lab_cluster), nodes=1, gpus=2,
                 entrypoint=[STALLED])
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    provider = get_provider(lab_cluster)
    eventually(lambda: [r.state for r in provider.describe_startup(attempt.provider_ref)]
               == ["rendezvous", "importing"], timeout=120, what="rank 0 waiting for rank 1")
    # Counted from the attempt's start as recorded, which a loaded machine
    # may put a second or more after `now`.
    attempt.refresh_from_db()
    started = attempt.started_at

    reconcile_job_unlocked(job.id, started + timedelta(seconds=30))
    assert reports(job) == []  # before the setting's 60 s

    reconcile_job_unlocked(job.id, started + timedelta(seconds=61))
    [event] = reports(job)
    assert "no first step 61 s after its launch, no rank heard from" in event.message
    assert "rank 0: rendezvous" in event.message
    assert "rank 1: importing" in event.message
    ranks = {r["rank"]: r for r in event.evidence["ranks"]}
    assert ranks[0]["state"] == "rendezvous" and "init_process_group" in ranks[0]["detail"]
    assert ranks[1]["state"] == "importing" and ranks[1]["heard_from"] is False
    assert event.attempt_id == attempt.id

    # Asked again only once per interval, and said again only if it changed.
    reconcile_job_unlocked(job.id, started + timedelta(seconds=90))
    reconcile_job_unlocked(job.id, started + timedelta(seconds=125))
    assert len(reports(job)) == 1
