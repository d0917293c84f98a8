"""A rank that dies with no sign from its node (the OOM killer's SIGKILL) is
relaunched in place, charged to the `process` class; the node goes only on
its own evidence (jobs/reconcile/rank_death.py)."""

import pytest
from django.utils import timezone

from clusters.models import Node, NodeEvent, NodeHealthEvent
from jobs.models import Phase
from jobs.reconcile import reconcile_job_unlocked
from jobs.recovery import budgets
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    running_job,
    submit,
    team_with_quota,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def cluster(db):
    return memory_cluster(heartbeat_deadline_s=10.0)


def running(cluster, now):
    return running_job(cluster, team_with_quota(cluster), now)


def kill_one_rank(cluster, attempt, node):
    """What torchrun reports when the kernel SIGKILLs one of its ranks: the
    rank's signal, and no exit record from it."""
    provider_of(cluster).exit_node(attempt.provider_ref, node.name, signal=9,
                                   log_tail="exitcode : -9 (pid 4242) Signal 9 (SIGKILL)")


def test_a_rank_killed_on_a_healthy_node_is_relaunched_in_place(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    placed = nodes_of(first)
    working = set(Node.objects.filter(cluster=cluster, is_spare=False)
                  .values_list("name", flat=True))

    kill_one_rank(cluster, first, placed[0])
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    job.refresh_from_db()
    assert first.failure_class == "process"
    second = job.attempts.get(number=2)
    assert nodes_of(second) == placed  # the same nodes, the same ranks
    for node in placed:
        node.refresh_from_db()
        assert node.state == Node.State.READY and node.failure_count == 0
    assert set(Node.objects.filter(cluster=cluster, is_spare=False)
               .values_list("name", flat=True)) == working
    assert not NodeHealthEvent.objects.filter(node__in=placed).exists()
    kinds = list(job.events.values_list("kind", flat=True))
    assert "RankDied" in kinds
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & set(kinds)
    restarting = job.events.get(kind="Restarting")
    assert restarting.evidence["class"] == "process"
    assert restarting.evidence["charged_to_job"] is True
    assert restarting.evidence["health_check"][placed[0].name]["provider_ready"] is True
    assert budgets.summary(job, later(now, 3))["process"] == {"spent": 1, "budget": 3,
                                                               "in_all": 1}
    assert placed[0].events.filter(reason__startswith="a rank died here").exists()


def _kill_twice(cluster, job, first, bad, now):
    """A rank SIGKILLed on `bad` in the first attempt, and again in the second."""
    kill_one_rank(cluster, first, bad)
    reconcile_job_unlocked(job.id, later(now, 3))
    second = job.attempts.get(number=2)
    heartbeat(second, 6, later(now, 4))
    reconcile_job_unlocked(job.id, later(now, 4))
    kill_one_rank(cluster, second, bad)
    reconcile_job_unlocked(job.id, later(now, 6))
    return second


def test_a_second_rank_death_on_the_same_node_is_checked_and_a_healthy_node_stays(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    preflights_before = [c for c in provider_of(cluster).fleet.calls if c[0] == "preflight"]
    second = _kill_twice(cluster, job, first, bad, now)

    second.refresh_from_db()
    bad.refresh_from_db()
    assert second.failure_class == "process"
    assert bad.state == Node.State.READY and bad.failure_count == 0
    restarting = job.events.filter(kind="Restarting").order_by("-id").first()
    assert restarting.evidence["suspects"] == [bad.name]
    assert bad.events.filter(reason__startswith="suspect").exists()
    # The relaunch checked the suspect before using it, and kept it.
    third = job.attempts.get(number=3)
    assert bad in nodes_of(third)
    checks = [c for c in provider_of(cluster).fleet.calls if c[0] == "preflight"]
    assert len(checks) == len(preflights_before) + 1 and bad.name in checks[-1][1]
    assert job.events.filter(kind="PreflightPassed", attempt=third).exists()
    assert not job.events.filter(kind__in=["NodeCordoned", "NodeReplaced"]).exists()


def test_a_suspect_that_fails_its_check_is_cordoned_and_counted_against_the_job(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    provider_of(cluster).fail_preflight(bad.name)
    _kill_twice(cluster, job, first, bad, now)

    bad.refresh_from_db()
    job.refresh_from_db()
    assert bad.state == Node.State.CORDONED
    assert job.events.filter(kind="PreflightFailed").exists()
    assert job.restart_marks["retired_by_job"] == [bad.name]
    assert bad not in nodes_of(job.attempts.get(number=3))


def test_a_node_the_provider_lost_is_replaced_even_before_the_cluster_pass_sees_it(cluster):
    """The quick health check asks the provider: a node whose processes all
    died because it went is hardware, whichever pass looks first."""
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]

    lose_node(cluster, bad, first.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    bad.refresh_from_db()
    assert first.failure_class == "hardware"
    assert bad.state == Node.State.REPLACED
    restarting = job.events.filter(kind="Restarting").first()
    assert "lost" in restarting.evidence["node_evidence"][bad.name]


def test_a_rank_death_after_a_health_event_on_its_node_is_hardware(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    NodeHealthEvent.objects.create(node=bad, kind="xid", severity="critical",
                                   message="XID 79", created_at=later(now, 2),
                                   handled_at=later(now, 2))

    kill_one_rank(cluster, first, bad)
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    assert first.failure_class == "hardware"
    restarting = job.events.get(kind="Restarting")
    assert restarting.evidence["node_evidence"][bad.name]["health_events"][0]["kind"] == "xid"


def test_the_process_budget_spent_fails_the_job(cluster):
    now = timezone.now()
    job = submit(cluster, team_with_quota(cluster), restart_budgets={"process": 0})
    launch(job, now)
    first = job.attempts.get()
    heartbeat(first, 5, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))

    kill_one_rank(cluster, first, nodes_of(first)[1])
    reconcile_job_unlocked(job.id, later(now, 3))

    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert "'process' restart budget spent" in job.last_error
    assert not NodeEvent.objects.filter(node__in=nodes_of(first), to_state="cordoned").exists()


# What torchrun leaves in a node's log when a program of the job's own (no
# SDK) raises on rank 1: the rank's traceback, then torchrun's report.
PROGRAM_LOG = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 7, in <module>
[rank1]:     raise ValueError("bad learning rate: -1")
[rank1]: ValueError: bad learning rate: -1
E1128 17:17:12.680000 18142 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 1) local_rank: 1 (pid: 18216) of binary: /usr/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_17:17:12
  host      : n1
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 18216)
  error_file: <N/A>
============================================================
"""
# Its peer on the other node, failing because rank 1 went.
PEER_LOG = """\
[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer \
[127.0.0.1]:22683
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : -6 (pid: 18300)
============================================================
"""


def fail_like_the_program(cluster, attempt):
    first, second = nodes_of(attempt)
    provider = provider_of(cluster)
    provider.exit_node(attempt.provider_ref, first.name, exit_code=1, log_tail=PROGRAM_LOG)
    provider.exit_node(attempt.provider_ref, second.name, exit_code=1, log_tail=PEER_LOG)


def test_a_program_that_fails_the_same_way_every_time_ends_the_job_not_the_fleet(cluster):
    now = timezone.now()
    job, attempt = running(cluster, now, entrypoint=["train.py"])
    placed = nodes_of(attempt)
    at = 2
    for number in (1, 2, 3):
        attempt = job.attempts.get(number=number)
        fail_like_the_program(cluster, attempt)
        reconcile_job_unlocked(job.id, later(now, at))
        at += 2
        attempt.refresh_from_db()
        assert attempt.failure_class == "process"

    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert job.attempts.count() == 3
    assert "crash loop: the same failure 3 times in a row" in job.last_error
    assert "ValueError: bad learning rate: -1" in job.last_error
    assert 'raise ValueError("bad learning rate: -1")' in job.last_error
    loop = job.events.get(kind="CrashLoop")
    assert loop.evidence["error"]["line"] == "ValueError: bad learning rate: -1"
    assert loop.evidence["error"]["rank"] == 1
    for node in placed:
        node.refresh_from_db()
        assert node.state == Node.State.READY and node.failure_count == 0
    assert not job.events.filter(kind__in=["NodeFailed", "NodeCordoned",
                                           "NodeReplaced"]).exists()


def running(cluster, now, **spec):  # noqa: F811 - the helper above, with a spec
    return running_job(cluster, team_with_quota(cluster), now, **spec)


def test_a_failure_that_changes_starts_the_count_again(cluster):
    now = timezone.now()
    job, first = running(cluster, now, entrypoint=["train.py"])
    fail_like_the_program(cluster, first)
    reconcile_job_unlocked(job.id, later(now, 2))
    second = job.attempts.get(number=2)
    kill_one_rank(cluster, second, nodes_of(second)[1])
    reconcile_job_unlocked(job.id, later(now, 4))
    third = job.attempts.get(number=3)
    fail_like_the_program(cluster, third)
    reconcile_job_unlocked(job.id, later(now, 6))

    job.refresh_from_db()
    assert job.phase != Phase.FAILED
    assert job.restart_marks["crash_loop"]["count"] == 1


def test_a_provider_that_cannot_be_asked_is_no_evidence_against_the_node(cluster, monkeypatch):
    from controlplane.lib.errors import TemporaryError
    from tests.support import memory_provider

    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]

    def stalled(self, pool):
        raise TemporaryError("the API server does not answer", delay=5.0)

    monkeypatch.setattr(memory_provider.MemoryProvider, "list_nodes", stalled)
    kill_one_rank(cluster, first, bad)
    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    bad.refresh_from_db()
    assert first.failure_class == "process"
    assert bad.state == Node.State.READY
    restarting = job.events.get(kind="Restarting")
    assert restarting.evidence["health_check"][bad.name]["provider_ready"] is None


def test_the_node_blamed_is_where_the_rank_ran_not_where_it_was_planned(cluster):
    """A scheduler may run a rank elsewhere than planned (a pod's nodeName);
    the node that went is the one the provider saw it on."""
    from dataclasses import replace

    now = timezone.now()
    job, first = running(cluster, now)
    planned = nodes_of(first)[0]
    real = Node.objects.filter(cluster=cluster, is_spare=True).first()
    fleet_attempt = provider_of(cluster).attempt(first.provider_ref)
    proc = fleet_attempt.nodes[planned.name]
    fleet_attempt.nodes[planned.name] = replace(
        proc, node=real.name, running=False, signal=9,
        node_lost=f"the node {real.name} was deleted with the pod on it")

    reconcile_job_unlocked(job.id, later(now, 3))

    first.refresh_from_db()
    planned.refresh_from_db()
    real.refresh_from_db()
    assert first.failure_class == "hardware"
    assert real.state == Node.State.REPLACED
    assert planned.state == Node.State.READY and planned.failure_count == 0
    assert job.events.get(kind="NodeCordoned").evidence["node"] == real.name


def test_ranks_silent_on_one_node_make_it_a_suspect_not_a_casualty(cluster):
    now = timezone.now()
    job, first = running(cluster, now)
    quiet = nodes_of(first)[1]
    # Heartbeats from node 0's ranks only; node 1's stopped at step 5.
    heartbeat(first, 9, later(now, 20), ranks=[0, 1])

    reconcile_job_unlocked(job.id, later(now, 20))

    first.refresh_from_db()
    quiet.refresh_from_db()
    assert first.failure_class == "hang"
    assert quiet.state == Node.State.READY and quiet.failure_count == 0
    restarting = job.events.filter(kind="Restarting").first()
    assert restarting.evidence["suspects"] == [quiet.name]
    assert not job.events.filter(kind__in=["NodeCordoned", "NodeReplaced"]).exists()
    second = job.attempts.get(number=2)
    assert quiet in nodes_of(second)
    assert job.events.filter(kind="PreflightPassed", attempt=second).exists()


def test_a_job_retires_at_most_its_bound_of_nodes_on_its_own_evidence(cluster):
    """max_nodes_retired_by_job (1): once one suspect failed its check, the
    job's failures check no more nodes: they stay in service."""
    now = timezone.now()
    job, first = running(cluster, now)
    bad = nodes_of(first)[0]
    provider_of(cluster).fail_preflight(bad.name)
    _kill_twice(cluster, job, first, bad, now)
    job.refresh_from_db()
    assert job.restart_marks["retired_by_job"] == [bad.name]

    third = job.attempts.get(number=3)
    other = [n for n in nodes_of(third) if n != bad][0]
    provider_of(cluster).fail_preflight(other.name)
    # Far on since the first failures: the same kill again is no crash loop.
    heartbeat(third, 1000, later(now, 8))
    reconcile_job_unlocked(job.id, later(now, 8))
    kill_one_rank(cluster, third, other)
    reconcile_job_unlocked(job.id, later(now, 10))
    fourth = job.attempts.get(number=4)
    heartbeat(fourth, 2000, later(now, 11))
    reconcile_job_unlocked(job.id, later(now, 11))
    kill_one_rank(cluster, fourth, other)
    reconcile_job_unlocked(job.id, later(now, 12))

    other.refresh_from_db()
    assert other.state == Node.State.READY
    restarting = job.events.filter(kind="Restarting").order_by("-id").first()
    assert restarting.evidence["suspects"] == []
