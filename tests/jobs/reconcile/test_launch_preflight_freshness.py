"""A launch skips the preflight when every chosen node passed one recently
(`preflight_max_age_s`): survivors at the launch before, spares when they
joined. On the in-memory provider, which counts its preflight calls."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Node
from jobs.models import JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    kinds,
    later,
    launch,
    memory_cluster,
    nodes_of,
    provider_of,
    report_not_ready,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def preflight_calls(cluster) -> list[tuple]:
    return [c[1] for c in provider_of(cluster).fleet.calls if c[0] == "preflight"]


def launched(cluster, now, **kw):
    job = submit(cluster, team_with_quota(cluster), **kw)
    launch(job, now)
    job.refresh_from_db()
    return job, job.attempts.get()


def kill_and_relaunch(cluster, job, attempt, now):
    """Rank exits of a node killed under a running attempt, then the job's pass."""
    heartbeat(attempt, 5, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    write_checkpoint(job, 4, attempt, created_at=later(now, 2))
    bad, good = nodes_of(attempt)
    report_not_ready(cluster, bad)
    provider_of(cluster).exit_node(attempt.provider_ref, bad.name, signal=9, log_tail="Killed")
    reconcile_job_unlocked(job.id, later(now, 10))
    job.refresh_from_db()
    return bad, good


def test_a_relaunch_after_a_node_failure_skips_the_preflight_when_every_node_passed_recently(db):
    cluster = memory_cluster(name="mem-fresh")
    spare = Node.objects.get(cluster=cluster, is_spare=True)
    assert spare.preflight_passed_at is not None  # checked when it joined
    now = timezone.now()
    job, attempt = launched(cluster, now)
    assert kinds(job)[-2:] == ["PreflightPassed", "Launched"]
    checks_before = len(preflight_calls(cluster))

    bad, good = kill_and_relaunch(cluster, job, attempt, now)

    second = job.attempts.get(number=2)
    assert {n.name for n in nodes_of(second)} == {good.name, spare.name}
    assert job.phase == Phase.STARTING
    assert len(preflight_calls(cluster)) == checks_before  # no check on the critical path
    assert kinds(job)[-4:] == ["Restarting", "PreflightSkipped", "Launched",
                               "ResumedFromCheckpoint"]
    skipped = JobEvent.objects.get(job=job, kind="PreflightSkipped")
    assert skipped.attempt_id == second.id
    spare.refresh_from_db()
    assert skipped.evidence == {
        good.name: 10.0,  # passed at the first launch, `now`
        spare.name: pytest.approx((later(now, 10) - spare.preflight_passed_at).total_seconds(),
                                  abs=1e-3),
    }
    assert second.preflight["ok"] is True and second.preflight["skipped"] is True


def test_the_first_launch_on_never_checked_nodes_runs_the_check_and_stamps_them(db):
    cluster = memory_cluster(name="mem-first")
    working = Node.objects.filter(cluster=cluster, is_spare=False)
    assert not working.exclude(preflight_passed_at=None).exists()
    now = timezone.now()

    job, attempt = launched(cluster, now)

    chosen = nodes_of(attempt)
    assert preflight_calls(cluster)[-1] == tuple(n.name for n in chosen)
    assert "PreflightSkipped" not in kinds(job)
    assert job.events.get(kind="PreflightPassed").evidence["allreduce_gbps"] == 10.0
    assert all(n.preflight_passed_at == now for n in chosen)
    # Only the checked nodes are vouched for.
    others = working.exclude(pk__in=[n.pk for n in chosen])
    assert others.exists() and not others.exclude(preflight_passed_at=None).exists()


def test_a_node_whose_pass_is_older_than_the_max_age_is_checked_again(db):
    cluster = memory_cluster(name="mem-stale", size=2, spares=0, preflight_max_age_s=600)
    now = timezone.now()
    fresh, stale = Node.objects.filter(cluster=cluster).order_by("name")
    Node.objects.filter(pk=fresh.pk).update(preflight_passed_at=now - timedelta(seconds=10))
    Node.objects.filter(pk=stale.pk).update(preflight_passed_at=now - timedelta(seconds=601))

    job, attempt = launched(cluster, now)

    assert preflight_calls(cluster) == [(fresh.name, stale.name)]
    assert "PreflightSkipped" not in kinds(job)
    assert kinds(job)[-2:] == ["PreflightPassed", "Launched"]
    assert {n.preflight_passed_at for n in nodes_of(attempt)} == {now}


def test_a_node_that_fails_its_check_loses_its_earlier_pass(db):
    cluster = memory_cluster(name="mem-lose", size=3, spares=0)
    now = timezone.now()
    first, *_ = Node.objects.filter(cluster=cluster).order_by("name")
    Node.objects.filter(cluster=cluster).update(preflight_passed_at=now - timedelta(hours=2))
    provider_of(cluster).fail_preflight(first.name)

    job, attempt = launched(cluster, now)

    first.refresh_from_db()
    assert first.state == Node.State.CORDONED and first.preflight_passed_at is None
    assert first.name not in {n.name for n in nodes_of(attempt)}
    assert {n.preflight_passed_at for n in nodes_of(attempt)} == {now}


def test_preflight_false_runs_no_check_anywhere(db):
    cluster = memory_cluster(name="mem-off", preflight=False)
    now = timezone.now()
    job, attempt = launched(cluster, now)
    kill_and_relaunch(cluster, job, attempt, now)

    assert preflight_calls(cluster) == []  # not at launch, relaunch, nor a spare's join
    assert job.attempts.count() == 2 and job.phase == Phase.STARTING
    assert not [k for k in kinds(job) if k.startswith("Preflight")]
    assert all(a.preflight == {} for a in job.attempts.all())
    assert not Node.objects.filter(cluster=cluster).exclude(preflight_passed_at=None).exists()
