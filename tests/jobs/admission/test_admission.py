"""Admission: gangs whole or not at all, quotas, capacity, order, reasons."""

import pytest
from django.utils import timezone

from clusters.models import Node
from jobs.admission import admit
from jobs.models import JobEvent, Phase, Team
from tests.fleet_helpers import later, memory_cluster, submit, team_with_quota

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(size=4, spares=1)  # 4 working nodes × 2 GPUs


def queued(mem_cluster, team, now, **kw):
    job = submit(mem_cluster, team, **kw)
    job.transition(Phase.QUEUED, reason="Queued", now=now)
    return job


def phases(*jobs):
    for job in jobs:
        job.refresh_from_db()
    return [job.phase for job in jobs]


def test_it_admits_by_priority_then_submit_time(mem_cluster):
    team = team_with_quota(mem_cluster, gpus=4)
    now = timezone.now()
    early = queued(mem_cluster, team, now, name="early")
    urgent = queued(mem_cluster, team, later(now, 1), name="urgent", priority=5)
    report = admit(mem_cluster.id, later(now, 2))
    assert report.admitted == [urgent.id]
    assert phases(early, urgent) == [Phase.QUEUED, Phase.ADMITTED]
    early.refresh_from_db()
    assert early.pending_reason == "needs 4 GPUs; team quota has 0 free; position 1 in queue"
    assert JobEvent.objects.get(job=urgent, kind="Admitted").evidence["gpus"] == 4


def test_a_team_without_a_quota_is_told_so(mem_cluster):
    team = Team.objects.create(name="nobody")
    job = queued(mem_cluster, team, timezone.now())
    admit(mem_cluster.id, timezone.now())
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED
    assert job.pending_reason == "no quota on cluster mem-a; position 1 in queue"


def test_a_gang_waits_whole_for_healthy_nodes_and_blocks_lower_jobs_of_the_pool(mem_cluster):
    big_team = team_with_quota(mem_cluster, name="big", gpus=16)
    small_team = team_with_quota(mem_cluster, name="small", gpus=16)
    now = timezone.now()
    # The running gang is the small team's, so fair share (the team holding
    # least goes first) and priority agree that the gang is considered first.
    running = queued(mem_cluster, small_team, now, name="running", nodes=2)
    admit(mem_cluster.id, now)
    Node.objects.filter(cluster=mem_cluster, is_spare=False, state="ready").exclude(
        pk__in=[]).order_by("name").first().cordon("broken")
    gang = queued(mem_cluster, big_team, later(now, 1), name="gang", nodes=3, priority=1)
    small = queued(mem_cluster, small_team, later(now, 2), name="small", nodes=1)
    report = admit(mem_cluster.id, later(now, 3))
    assert report.admitted == []
    assert phases(running, gang, small) == [Phase.ADMITTED, Phase.QUEUED, Phase.QUEUED]
    assert gang.pending_reason == (
        "needs 3 nodes; 1 healthy node free in pool gpu; position 1 in queue")
    assert small.pending_reason == (
        f"waiting behind job #{gang.id} (gang) for pool gpu; position 2 in queue")


def test_a_job_blocked_by_its_own_quota_does_not_block_other_teams(mem_cluster):
    poor = team_with_quota(mem_cluster, name="poor", gpus=2)
    rich = team_with_quota(mem_cluster, name="rich", gpus=8)
    now = timezone.now()
    big = queued(mem_cluster, poor, now, name="big", nodes=2, priority=9)
    other = queued(mem_cluster, rich, later(now, 1), name="other", nodes=2)
    admit(mem_cluster.id, later(now, 2))
    assert phases(big, other) == [Phase.QUEUED, Phase.ADMITTED]
    assert big.pending_reason == "needs 4 GPUs; team quota has 2 free; position 1 in queue"


def test_it_never_admits_past_the_running_jobs_limit(mem_cluster):
    team = team_with_quota(mem_cluster, gpus=16, max_running_jobs=1)
    now = timezone.now()
    first = queued(mem_cluster, team, now, name="a", nodes=1)
    second = queued(mem_cluster, team, later(now, 1), name="b", nodes=1)
    admit(mem_cluster.id, later(now, 2))
    assert phases(first, second) == [Phase.ADMITTED, Phase.QUEUED]
    assert second.pending_reason.startswith("team runs 1 jobs on cluster mem-a; quota allows 1")


def test_admission_books_the_queueing_time(mem_cluster):
    team = team_with_quota(mem_cluster)
    now = timezone.now()
    job = queued(mem_cluster, team, now)
    admit(mem_cluster.id, later(now, 7))
    entry = job.goodput.get(category="queued")
    assert entry.seconds == pytest.approx(7.0)
    assert entry.gpu_seconds == pytest.approx(28.0)


def test_a_second_pass_admits_nothing_more(mem_cluster):
    team = team_with_quota(mem_cluster)
    now = timezone.now()
    queued(mem_cluster, team, now)
    assert len(admit(mem_cluster.id, now).admitted) == 1
    assert admit(mem_cluster.id, now).admitted == []


def test_a_pass_whose_clock_is_older_than_the_queueing_admits_after_it(mem_cluster):
    team = team_with_quota(mem_cluster)
    now = timezone.now()
    job = queued(mem_cluster, team, later(now, 5))
    admit(mem_cluster.id, now)
    kinds = list(job.events.order_by("created_at", "id").values_list("kind", flat=True))
    assert kinds[-2:] == ["Queued", "Admitted"]
    assert job.goodput.get(category="queued").seconds == 0
