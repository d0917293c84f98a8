"""Sharing a cluster: borrowing and reclaim, fair share by weight,
checkpoint-then-preempt, and the reasons a waiting job is given."""

import pytest
from django.utils import timezone

from clusters.models import Node
from jobs.admission import admit, quota_usage
from jobs.admission.sharing import EVICTING, NOMINATED
from jobs.goodput.models import GoodputEntry
from jobs.models import JobAttempt, JobEvent, Phase, Quota
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


def queued(cluster, team, now, **kw):
    job = submit(cluster, team, **kw)
    job.transition(Phase.QUEUED, reason="Queued", now=now)
    return job


def running(cluster, team, now, step=10, **kw):
    """A gang admitted, launched and past its first step."""
    job = submit(cluster, team, **kw)
    launch(job, now)
    attempt = JobAttempt.objects.get(job=job)
    heartbeat(attempt, step, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.pending_reason
    return job


def live_attempt(job):
    return JobAttempt.objects.exclude(state__in=JobAttempt.ENDED).get(job=job)


def exit_after_checkpoint(victim, step, now):
    """What the SDK does on `stop`: an emergency checkpoint with the request
    id it was handed, then every node's ranks exit 83."""
    attempt = live_attempt(victim)
    heartbeat(attempt, step, now)
    write_checkpoint(victim, step, attempt, request_id=attempt.checkpoint_request_id,
                     emergency=True, created_at=now)
    provider = provider_of(victim.cluster)
    for name in attempt.placements.values_list("node__name", flat=True):
        provider.exit_node(attempt.provider_ref, name, exit_code=83)


def reload(*jobs):
    for job in jobs:
        job.refresh_from_db()
    return jobs


@pytest.fixture
def cluster(db):
    return memory_cluster(size=4, spares=0)  # 4 working nodes × 2 GPUs


def test_a_team_that_may_borrow_is_admitted_into_idle_quota_and_marked(cluster):
    vision = team_with_quota(cluster, name="vision", gpus=4, can_borrow=True)
    nlp = team_with_quota(cluster, name="nlp", gpus=4)
    now = timezone.now()
    own = queued(cluster, vision, now, name="own")
    extra = queued(cluster, vision, later(now, 1), name="extra")
    report = admit(cluster.id, later(now, 2))
    assert report.admitted == [own.id, extra.id]
    reload(own, extra)
    assert (own.borrowed_gpus, own.borrowed_from) == (0, {})
    assert (extra.borrowed_gpus, extra.borrowed_from) == (4, {str(nlp.id): 4})
    event = JobEvent.objects.get(job=extra, kind="Admitted")
    assert event.message.endswith("borrowing 4 idle GPUs from team nlp")
    usage = quota_usage(Quota.objects.filter(cluster=cluster).order_by("team__name"))
    by_team = {q.team.name: usage[q.pk] for q in Quota.objects.filter(cluster=cluster)}
    assert by_team["vision"]["gpus_borrowed"] == 4 and by_team["vision"]["gpus_used"] == 8
    assert by_team["nlp"]["gpus_lent"] == 4 and by_team["nlp"]["gpus_free"] == 0


def test_a_team_that_may_not_borrow_waits_at_its_quota(cluster):
    vision = team_with_quota(cluster, name="vision", gpus=4)
    team_with_quota(cluster, name="nlp", gpus=4)
    now = timezone.now()
    queued(cluster, vision, now, name="own")
    extra = queued(cluster, vision, later(now, 1), name="extra")
    admit(cluster.id, later(now, 2))
    reload(extra)
    assert extra.phase == Phase.QUEUED
    assert extra.pending_reason == "needs 4 GPUs; team quota has 0 free; position 1 in queue"


def test_a_lenders_queued_jobs_are_never_lent_out(cluster):
    vision = team_with_quota(cluster, name="vision", gpus=4, can_borrow=True)
    nlp = team_with_quota(cluster, name="nlp", gpus=4, max_running_jobs=0)
    now = timezone.now()
    queued(cluster, vision, now, name="own")
    extra = queued(cluster, vision, later(now, 1), name="extra")
    # nlp cannot run it now (its job limit), but it asks for its 4 GPUs.
    queued(cluster, nlp, later(now, 2), name="theirs")
    admit(cluster.id, later(now, 3))
    reload(extra)
    assert extra.phase == Phase.QUEUED
    assert extra.pending_reason.startswith(
        "needs 4 GPUs; team quota has 0 free; 0 idle GPUs to borrow")


def test_a_lender_reclaims_its_gpus_after_the_borrowers_checkpoint(cluster):
    vision = team_with_quota(cluster, name="vision", gpus=4, can_borrow=True)
    nlp = team_with_quota(cluster, name="nlp", gpus=4)
    now = timezone.now()
    running(cluster, vision, now, name="own")
    borrower = running(cluster, vision, later(now, 1), name="borrower")
    assert borrower.borrowed_gpus == 4
    theirs = queued(cluster, nlp, later(now, 5), name="theirs")
    admit(cluster.id, later(now, 6))
    reload(theirs)
    assert theirs.phase == Phase.QUEUED
    assert theirs.pending_reason == (
        "reclaiming 4 GPUs lent to team vision; position 1 in queue")
    assert any(c["type"] == NOMINATED for c in theirs.conditions)
    assert JobEvent.objects.filter(job=theirs, kind="MakingRoom").count() == 1
    attempt = live_attempt(borrower)
    assert attempt.stop_requested_at is not None and attempt.checkpoint_request_id
    # The borrower checkpoints at step 14 and exits; its reconcile requeues it.
    exit_after_checkpoint(borrower, 14, later(now, 8))
    reconcile_job_unlocked(borrower.id, later(now, 9))
    reload(borrower)
    assert borrower.phase == Phase.QUEUED
    assert (borrower.borrowed_gpus, borrower.borrowed_from) == (0, {})
    event = JobEvent.objects.get(job=borrower, kind="Preempted")
    assert event.message == f"reclaimed by job #{theirs.id}: checkpoint at step 14, 0 steps lost"
    assert event.evidence["checkpoint_step"] == 14 and event.evidence["steps_lost"] == 0
    assert borrower.restart_counts == {}
    assert admit(cluster.id, later(now, 10)).admitted == [theirs.id]
    reload(theirs, borrower)
    assert not any(c["type"] == NOMINATED for c in theirs.conditions)
    assert borrower.phase == Phase.QUEUED  # nlp's queue no longer lends: nothing idle


def test_a_high_priority_job_preempts_a_lower_one_which_resumes_from_its_checkpoint(cluster):
    team = team_with_quota(cluster, name="vision", gpus=8)
    now = timezone.now()
    low = running(cluster, team, now, name="low", nodes=4, priority=0)
    high = queued(cluster, team, later(now, 5), name="high", nodes=2, priority=5)
    admit(cluster.id, later(now, 6))
    reload(high, low)
    assert high.pending_reason == (
        f"will preempt job #{low.id} (priority 0) after its checkpoint; position 1 in queue")
    assert next(c for c in low.conditions if c["type"] == EVICTING)["by"] == high.id
    assert JobEvent.objects.filter(job=low, kind="PreemptionRequested").count() == 1
    # A second pass while the victim checkpoints asks nothing more of anyone.
    admit(cluster.id, later(now, 7))
    assert JobEvent.objects.filter(job=low, kind="PreemptionRequested").count() == 1
    assert JobEvent.objects.filter(job=high, kind="MakingRoom").count() == 1
    # Still waiting for the checkpoint: the victim keeps its nodes.
    reconcile_job_unlocked(low.id, later(now, 8))
    assert reload(low)[0].phase == Phase.RUNNING
    exit_after_checkpoint(low, 12, later(now, 9))
    reconcile_job_unlocked(low.id, later(now, 10))
    reload(low)
    assert low.phase == Phase.QUEUED and low.preempted_at is not None
    preempted = JobEvent.objects.get(job=low, kind="Preempted")
    assert preempted.evidence["by"] == high.id
    assert preempted.evidence["waited_s"] == pytest.approx(4.0)
    assert admit(cluster.id, later(now, 11)).admitted == [high.id]
    # The high job is cancelled; the victim, first in its team, comes back
    # and resumes from the checkpoint it saved: no step lost.
    high.request_cancel("owner", now=later(now, 12))
    reconcile_job_unlocked(high.id, later(now, 12))
    assert admit(cluster.id, later(now, 13)).admitted == [low.id]
    reconcile_job_unlocked(low.id, later(now, 13))
    attempt = live_attempt(low)
    assert attempt.number == 2 and attempt.resume_step == 12
    resumed = JobEvent.objects.get(job=low, kind="ResumedFromCheckpoint")
    assert resumed.evidence["steps_lost"] == 0


def test_a_stop_just_after_a_periodic_save_of_that_step_takes_that_save_at_once(cluster):
    """The SDK does not save a step twice: a stop that comes as the periodic
    save of the step the gang stops at commits leaves no emergency
    checkpoint, and that save (neither emergency nor carrying the request,
    and older than it) holds every step the gang made."""
    team = team_with_quota(cluster, name="vision", gpus=8)
    now = timezone.now()
    low = running(cluster, team, now, name="low", nodes=4, step=10)
    attempt = live_attempt(low)
    write_checkpoint(low, 10, attempt, created_at=later(now, 5))
    high = queued(cluster, team, later(now, 5), name="high", nodes=2, priority=5)
    admit(cluster.id, later(now, 6))
    provider = provider_of(cluster)
    for name in attempt.placements.values_list("node__name", flat=True):
        provider.exit_node(attempt.provider_ref, name, exit_code=83)

    reconcile_job_unlocked(low.id, later(now, 7))

    reload(low)
    assert low.phase == Phase.QUEUED  # not after the whole wait
    preempted = JobEvent.objects.get(job=low, kind="Preempted")
    assert preempted.evidence["checkpoint_step"] == 10
    assert preempted.evidence["steps_lost"] == 0
    assert not GoodputEntry.objects.filter(job=low, category="preemption").exists()
    assert admit(cluster.id, later(now, 8)).admitted == [high.id]


def test_a_victim_that_cannot_checkpoint_in_time_is_stopped_and_its_work_booked(db):
    cluster = memory_cluster(size=4, spares=0, preemption_checkpoint_wait_s=5.0)
    team = team_with_quota(cluster, name="vision", gpus=8)
    now = timezone.now()
    low = running(cluster, team, now, name="low", nodes=4)
    high = queued(cluster, team, later(now, 5), name="high", nodes=2, priority=5)
    admit(cluster.id, later(now, 6))
    reconcile_job_unlocked(low.id, later(now, 9))
    assert reload(low)[0].phase == Phase.RUNNING
    reconcile_job_unlocked(low.id, later(now, 12))
    reload(low)
    assert low.phase == Phase.QUEUED
    event = JobEvent.objects.get(job=low, kind="Preempted")
    assert event.evidence["checkpoint_step"] is None
    assert event.evidence["steps_lost"] == 10
    lost = GoodputEntry.objects.get(job=low, category="preemption")
    assert lost.seconds == pytest.approx(11.0)  # first step (now+1) to the stop (now+12)
    assert provider_of(cluster).attempt(JobAttempt.objects.get(job=low).provider_ref).stopped
    assert admit(cluster.id, later(now, 13)).admitted == [high.id]


def test_nothing_is_preempted_for_a_job_that_would_still_not_fit(cluster):
    team = team_with_quota(cluster, name="vision", gpus=16)
    now = timezone.now()
    low = running(cluster, team, now, name="low", nodes=2)
    # 6 nodes on a pool of 4: stopping every gang would not make it fit.
    huge = queued(cluster, team, later(now, 5), name="huge", nodes=6, priority=5)
    admit(cluster.id, later(now, 6))
    reload(huge, low)
    assert huge.pending_reason == (
        "needs 6 nodes; 2 healthy nodes free in pool gpu; position 1 in queue")
    assert live_attempt(low).stop_requested_at is None
    assert not JobEvent.objects.filter(kind__in=["PreemptionRequested", "MakingRoom"]).exists()
    assert low.phase == Phase.RUNNING


def test_weights_split_a_contended_cluster_in_proportion(db):
    cluster = memory_cluster(size=8, spares=0)  # 16 GPUs
    heavy = team_with_quota(cluster, name="heavy", gpus=16, priority_weight=3)
    light = team_with_quota(cluster, name="light", gpus=16, priority_weight=1)
    now = timezone.now()
    for i in range(8):
        queued(cluster, light, later(now, i), name=f"light-{i}", nodes=1)
        queued(cluster, heavy, later(now, 10 + i), name=f"heavy-{i}", nodes=1)
    admit(cluster.id, later(now, 20))
    usage = quota_usage(Quota.objects.filter(cluster=cluster))
    held = {q.team.name: usage[q.pk]["gpus_used"] for q in Quota.objects.filter(cluster=cluster)}
    assert held == {"heavy": 12, "light": 4}


def test_a_team_over_its_fair_share_is_told_so(db):
    cluster = memory_cluster(size=8, spares=0)  # 16 GPUs; two teams of weight 1: 8 each
    big = team_with_quota(cluster, name="big", gpus=32)
    small = team_with_quota(cluster, name="small", gpus=32)
    now = timezone.now()
    running(cluster, big, now, name="wide", nodes=6)
    running(cluster, small, now, name="narrow", nodes=1)
    more = queued(cluster, big, later(now, 5), name="more", nodes=3)
    admit(cluster.id, later(now, 6))
    reload(more)
    assert more.pending_reason == (
        "needs 3 nodes; 1 healthy node free in pool gpu; "
        "team fair share: holds 12 of its 8-GPU share; position 1 in queue")


def test_with_fair_share_off_the_queue_order_is_priority_then_submit_time(db):
    cluster = memory_cluster(size=2, spares=0, fair_share=False)
    rich = team_with_quota(cluster, name="rich", gpus=8)
    poor = team_with_quota(cluster, name="poor", gpus=8)
    now = timezone.now()
    running(cluster, rich, now, name="first", nodes=1)
    mine = queued(cluster, rich, later(now, 5), name="mine", nodes=1, priority=1)
    theirs = queued(cluster, poor, later(now, 4), name="theirs", nodes=1)
    assert admit(cluster.id, later(now, 6)).admitted == [mine.id]
    assert reload(theirs)[0].phase == Phase.QUEUED


def test_a_preempted_job_goes_first_among_its_teams_jobs_of_its_priority(cluster):
    team = team_with_quota(cluster, name="vision", gpus=4)
    now = timezone.now()
    older = queued(cluster, team, now, name="older")
    back = queued(cluster, team, later(now, 1), name="back")
    type(back).objects.filter(pk=back.pk).update(preempted_at=later(now, 2))
    assert admit(cluster.id, later(now, 3)).admitted == [back.id]
    reload(back, older)
    assert back.preempted_at is None  # an admission clears the mark
    assert older.phase == Phase.QUEUED


def test_a_nomination_whose_victims_are_gone_is_dropped(cluster):
    team = team_with_quota(cluster, name="vision", gpus=8)
    now = timezone.now()
    low = running(cluster, team, now, name="low", nodes=4)
    high = queued(cluster, team, later(now, 5), name="high", nodes=4, priority=5)
    admit(cluster.id, later(now, 6))
    assert any(c["type"] == NOMINATED for c in reload(high)[0].conditions)
    # The victim is cancelled instead, and two nodes break meanwhile.
    low.request_cancel("owner", now=later(now, 7))
    reconcile_job_unlocked(low.id, later(now, 7))
    for node in Node.objects.filter(cluster=cluster).order_by("name")[:2]:
        node.cordon("broken")
    admit(cluster.id, later(now, 10))
    reload(high)
    assert high.phase == Phase.QUEUED
    assert not any(c["type"] == NOMINATED for c in high.conditions)
    assert high.pending_reason == (
        "needs 4 nodes; 2 healthy nodes free in pool gpu; position 1 in queue")
