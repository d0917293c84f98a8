"""Admission has one owner, the cluster's admission pass: a queued job's own
reconcile only reads the reason the pass left it, and every change of the
queue or of the capacity asks for a pass once it commits (the task runs
eagerly here, so the test sees what a worker would do with it)."""

import pytest
from celery import current_app
from django.utils import timezone

from clusters.models import Node
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.admission import admit
from jobs.models import Phase, Quota
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(size=4, spares=1, queue_interval_s=10.0)  # 4 nodes × 2 GPUs


@pytest.fixture
def eager_tasks():
    """Tasks sent on commit run at once, in this process. (The app reads its
    settings under the CELERY_ namespace: controlplane/celery.py.)"""
    current_app.conf.CELERY_TASK_ALWAYS_EAGER = True
    yield
    current_app.conf.CELERY_TASK_ALWAYS_EAGER = False


def queued(mem_cluster, team, at, **kw):
    job = submit(mem_cluster, team, **kw)
    job.transition(Phase.QUEUED, reason="Queued", now=at)
    return job


def phase(job):
    job.refresh_from_db()
    return job.phase


def test_a_queued_job_s_reconcile_reads_its_reason_and_admits_nothing(mem_cluster):
    team = team_with_quota(mem_cluster, gpus=4)
    now = timezone.now()
    first = queued(mem_cluster, team, now, name="first")
    second = queued(mem_cluster, team, later(now, 1), name="second")
    admit(mem_cluster.id, later(now, 2))  # admits `first`; `second` waits for the quota
    assert phase(first) == Phase.ADMITTED
    second.refresh_from_db()
    assert second.pending_reason == "needs 4 GPUs; team quota has 0 free; position 1 in queue"
    Quota.objects.filter(team=team).update(gpus=8)  # a change no pass has seen yet

    result = reconcile_job_unlocked(second.id, later(now, 3))

    assert phase(second) == Phase.QUEUED
    assert result.note == second.pending_reason and result.requeue_after == 10.0
    assert not second.events.filter(kind="Admitted").exists()
    admit(mem_cluster.id, later(now, 4))
    assert phase(second) == Phase.ADMITTED


def test_a_job_s_first_reconcile_queues_it_and_asks_for_a_pass_on_commit(
        mem_cluster, eager_tasks, django_capture_on_commit_callbacks):
    team = team_with_quota(mem_cluster, gpus=8)
    job = submit(mem_cluster, team)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_job_unlocked(job.id, timezone.now())
    # The pass admitted it, and the admitted job's own reconcile launched it.
    assert phase(job) == Phase.STARTING
    assert job.events.filter(kind="Admitted").exists()


def test_capacity_freed_by_a_finished_job_is_admitted_without_waiting_for_a_sweep(
        mem_cluster, eager_tasks, django_capture_on_commit_callbacks):
    team = team_with_quota(mem_cluster, gpus=16)
    now = timezone.now()
    running = queued(mem_cluster, team, now, name="running", nodes=4)
    admit(mem_cluster.id, later(now, 1))
    reconcile_job_unlocked(running.id, later(now, 1))
    attempt = running.attempts.get()
    waiting = queued(mem_cluster, team, later(now, 1.5), name="waiting", nodes=2)
    admit(mem_cluster.id, later(now, 2))
    waiting.refresh_from_db()
    assert waiting.pending_reason == (
        "needs 2 nodes; 0 healthy nodes free in pool gpu; position 1 in queue")
    heartbeat(attempt, 20, later(now, 3))
    write_checkpoint(running, 20, attempt, created_at=later(now, 3))
    reconcile_job_unlocked(running.id, later(now, 3))
    provider_of(mem_cluster).finish(attempt.provider_ref)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_job_unlocked(running.id, later(now, 4))
    assert phase(running) == Phase.SUCCEEDED
    assert phase(waiting) == Phase.STARTING


def test_a_quota_raised_through_the_api_asks_for_a_pass(
        mem_cluster, eager_tasks, django_capture_on_commit_callbacks, api, admin_user_):
    team = team_with_quota(mem_cluster, gpus=0)
    job = queued(mem_cluster, team, timezone.now())
    admit(mem_cluster.id, timezone.now())
    assert phase(job) == Phase.QUEUED
    quota = Quota.objects.get(team=team)
    with django_capture_on_commit_callbacks(execute=True):
        resp = api(admin_user_).patch(f"/api/v1/quotas/{quota.pk}/", {"gpus": 8}, format="json")
    assert resp.status_code == 200, resp.content
    assert phase(job) == Phase.STARTING


def test_a_node_turning_ready_asks_for_a_pass_and_one_that_changes_nothing_does_not(
        mem_cluster, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sent:
        reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    assert sent == []  # nothing changed: no admission pass asked for
    node = Node.objects.filter(cluster=mem_cluster, is_spare=False).first()
    Node.objects.filter(pk=node.pk).update(state=Node.State.PROVISIONING)
    with django_capture_on_commit_callbacks() as sent:
        reconcile_cluster_unlocked(mem_cluster.id, timezone.now())
    assert len(sent) == 1


def test_a_job_sent_back_to_the_queue_at_launch_is_told_its_place_in_it(mem_cluster):
    team = team_with_quota(mem_cluster, gpus=8)
    blocked = team_with_quota(mem_cluster, name="blocked", gpus=0)
    now = timezone.now()
    job = queued(mem_cluster, team, now, name="job")
    assert admit(mem_cluster.id, later(now, 1)).admitted == [job.id]
    ahead = queued(mem_cluster, blocked, later(now, 2), name="ahead", priority=5)
    for node in Node.objects.filter(cluster=mem_cluster, is_spare=False).order_by("name")[:3]:
        node.cordon("maintenance")
    reconcile_job_unlocked(job.id, later(now, 3))  # no nodes at launch: back to the queue
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED
    assert job.pending_reason == (
        "needs 2 healthy nodes; 1 free in pool gpu, 1 spare ready, 0 provisioning; "
        "position 2 in queue")
    assert job.events.filter(kind="Requeued").exists()
    admit(mem_cluster.id, later(now, 4))  # the pass its requeueing asked for
    job.refresh_from_db()
    assert job.pending_reason == (
        "needs 2 nodes; 1 healthy node free in pool gpu; position 2 in queue")
    ahead.refresh_from_db()
    assert ahead.pending_reason.endswith("position 1 in queue")
