"""The job page is polled every few seconds for as long as someone watches
it, so what one poll renders must not grow with the job's age: the newest
checkpoints and attempts only, with the rest a link away."""

import re
import time

from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints.models import Checkpoint
from frontend import jobdetail
from jobs.models import AttemptNode, JobAttempt, Phase

from .factories import checkpoint, make_job, run


def _many_checkpoints(job, attempt, steps, state=Checkpoint.State.VERIFIED):
    Checkpoint.objects.bulk_create([
        Checkpoint(job=job, attempt=attempt, step=s, uri=f"file:///ckpt/step-{s}", bytes=1024,
                   state=state)
        for s in steps
    ])


def _many_attempts(job, nodes, count):
    first = run(job, nodes)
    later = JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=n, state=JobAttempt.State.FAILED, failure_class="transient",
                   failure_reason=f"NCCL timeout in attempt {n}")
        for n in range(2, count + 1)
    ])
    AttemptNode.objects.bulk_create([
        AttemptNode(attempt=a, node=node, node_rank=rank)
        for a in later for rank, node in enumerate(nodes)
    ])
    return first


def _steps(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr data-step="(\d+)"', html)]


def _restart_steps(html: str) -> set[int]:
    return {int(s) for s in re.findall(r'data-restart="(\d+)"', html)}


def test_it_renders_only_the_newest_kept_checkpoints_on_each_poll(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    _many_checkpoints(job, attempt, range(10, 5001, 10))  # 500 kept
    _many_checkpoints(job, attempt, range(5010, 5060, 10), state=Checkpoint.State.DELETED)
    html = web(owner).get(f"/jobs/{job.pk}/live/").json()["fragments"]["job-checkpoints"]
    rows = _steps(html)
    assert len(rows) == jobdetail.CHECKPOINT_ROWS
    assert rows == list(range(5000, 5000 - 10 * jobdetail.CHECKPOINT_ROWS, -10))
    assert f"Newest {jobdetail.CHECKPOINT_ROWS} of 500 kept; 5 deleted by retention" in html
    assert f'href="/jobs/{job.pk}/checkpoints/"' in html


def test_it_renders_only_the_newest_attempts_and_counts_them_all(web, owner, team, cluster):
    job = make_job(team, cluster)
    _many_attempts(job, list(cluster.nodes.all()[:2]), 40)
    fragments = web(owner).get(f"/jobs/{job.pk}/live/").json()["fragments"]
    numbers = [int(n) for n in re.findall(r'<tr data-attempt="(\d+)"', fragments["job-attempts"])]
    assert numbers == list(range(40, 40 - jobdetail.ATTEMPT_ROWS, -1))
    assert f"Newest {jobdetail.ATTEMPT_ROWS} of 40 attempts" in fragments["job-attempts"]
    assert '<span class="label">Attempts</span>40' in fragments["job-status"]


def test_a_poll_costs_the_same_queries_for_a_long_job_as_for_a_new_one(
        web, owner, team, cluster):
    client = web(owner)
    nodes = list(cluster.nodes.filter(is_spare=False))

    # The tables only: the chart series are jobs.metrics.series' to bound, and the
    # page asks for them on fewer polls once a job's series are long.
    def queries_for(job):
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(f"/jobs/{job.pk}/live/?charts=0").status_code == 200
        return len(ctx.captured_queries)

    young = make_job(team, cluster, name="young")
    attempt = _many_attempts(young, nodes[:2], 2)
    _many_checkpoints(young, attempt, range(10, 40, 10))
    old = make_job(team, cluster, name="old")
    attempt = _many_attempts(old, nodes[2:4], 60)
    _many_checkpoints(old, attempt, range(10, 20001, 10))
    assert queries_for(old) == queries_for(young)


def test_it_never_offers_a_deleted_or_corrupt_checkpoint_as_a_restart_point(
        web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    checkpoint(job, attempt, 200, state=Checkpoint.State.COMMITTED)
    checkpoint(job, attempt, 300, state=Checkpoint.State.CORRUPT,
               state_reason="manifest checksum mismatch on shard 3")
    checkpoint(job, attempt, 400, state=Checkpoint.State.DELETED)
    client = web(owner)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert _steps(html) == [300, 200, 100]
    assert _restart_steps(html) == {200, 100}
    assert "manifest checksum mismatch" in html
    # The full history lists the deleted one, still without a restart button.
    history = client.get(f"/jobs/{job.pk}/checkpoints/").content.decode()
    assert _steps(history) == [400, 300, 200, 100]
    assert _restart_steps(history) == {200, 100}
    resp = client.post(f"/jobs/{job.pk}/restart/", {"from_step": "400"}, follow=True)
    assert "no committed or verified checkpoint at step 400" in resp.content.decode()
    job.refresh_from_db()
    assert job.restart_from_step is None


def test_a_job_that_ended_offers_no_restart(web, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    job.transition(Phase.SUCCEEDED, reason="Finished")
    assert _restart_steps(web(owner).get(f"/jobs/{job.pk}/").content.decode()) == set()


def test_an_ended_job_offers_its_owner_a_rerun_from_a_loadable_checkpoint(
        web, owner, teammate, team, cluster):
    job = make_job(team, cluster, owner)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    checkpoint(job, attempt, 200, state=Checkpoint.State.CORRUPT)
    job.transition(Phase.FAILED, reason="Failed", restart_counts={"hardware": 6},
                   budget_spent={"hardware": 1})
    page = web(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert _rerun_steps(page) == {100}
    assert "hardware 1/5 (6 in all)" in page
    assert _rerun_steps(web(teammate).get(f"/jobs/{job.pk}/").content.decode()) == set()
    refused = web(teammate).post(f"/jobs/{job.pk}/restart/", {"from_step": "100"}, follow=True)
    assert "Only the owner" in refused.content.decode()
    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    done = web(owner).post(f"/jobs/{job.pk}/restart/", {"from_step": "100"}, follow=True)
    assert "Rerun from step 100 requested." in done.content.decode()
    job.refresh_from_db()
    assert (job.phase, job.restart_from_step, job.restart_counts) == (Phase.QUEUED, 100, {})
    assert job.events.get(kind="Rerun").actor == "user:olivia"


def _rerun_steps(html: str) -> set[int]:
    return {int(s) for s in re.findall(r'data-rerun="(\d+)"', html)}


def test_the_history_pages_list_everything_paginated(web, teammate, team, cluster):
    job = make_job(team, cluster)
    attempt = _many_attempts(job, list(cluster.nodes.all()[:2]), 60)
    _many_checkpoints(job, attempt, range(1, 121))
    client = web(teammate)
    first = client.get(f"/jobs/{job.pk}/checkpoints/").content.decode()
    assert _steps(first) == list(range(120, 70, -1))
    third = client.get(f"/jobs/{job.pk}/checkpoints/?page=3").content.decode()
    assert _steps(third) == list(range(20, 0, -1))
    attempts = client.get(f"/jobs/{job.pk}/attempts/?page=2").content.decode()
    assert re.findall(r'<tr data-attempt="(\d+)"', attempts) == [str(n) for n in range(10, 0, -1)]


def test_an_outsider_gets_404_for_the_history_pages(web, outsider, team, cluster):
    job = make_job(team, cluster)
    for url in (f"/jobs/{job.pk}/checkpoints/", f"/jobs/{job.pk}/attempts/"):
        assert web(outsider).get(url).status_code == 404


def test_a_restarting_job_shows_why_it_waits_in_the_list(web, owner, team, cluster):
    waiting = make_job(team, cluster, name="waits-for-a-spare")
    run(waiting, list(cluster.nodes.all()[:2]))
    waiting.transition(Phase.RESTARTING, reason="Restarting",
                       pending_reason="needs 2 healthy nodes; 1 free in pool default")
    backing_off = make_job(team, cluster, name="backs-off")
    run(backing_off, list(cluster.nodes.all()[2:4]))
    backing_off.transition(Phase.RESTARTING, reason="Restarting", conditions=[
        {"type": "RestartBackoff", "until": time.time() + 30, "seconds": 30.0}])
    admitted = make_job(team, cluster, name="admitted-requeued")
    admitted.transition(Phase.QUEUED, reason="Queued")
    admitted.transition(Phase.ADMITTED, reason="Admitted",
                        pending_reason="preflight failed on cpu-a-1; no healthy replacement")
    html = web(owner).get("/jobs/").content.decode()
    assert "needs 2 healthy nodes; 1 free in pool default" in html
    assert re.search(r"backing off after a transient failure; retrying in (29|30)s", html)
    assert "preflight failed on cpu-a-1; no healthy replacement" in html
    detail = web(owner).get(f"/jobs/{backing_off.pk}/").content.decode()
    assert 'id="pending-reason"' in detail and "backing off" in detail


def test_a_running_job_or_an_expired_backoff_shows_no_reason(web, owner, team, cluster):
    job = make_job(team, cluster, name="runs")
    run(job, list(cluster.nodes.all()[:2]))
    job.__class__.objects.filter(pk=job.pk).update(
        pending_reason="needs 2 healthy nodes; 0 free",
        conditions=[{"type": "RestartBackoff", "until": time.time() - 5, "seconds": 2.0}])
    html = web(owner).get("/jobs/").content.decode()
    assert "needs 2 healthy nodes" not in html and 'class="reason"' not in html
    job.refresh_from_db()
    job.transition(Phase.RESTARTING, reason="Restarting", pending_reason="")
    html = web(owner).get("/jobs/").content.decode()
    assert "backing off" not in html and 'class="reason"' not in html


def test_retries_that_resumed_from_the_same_step_share_one_chart_mark(
        web, owner, team, cluster):
    job = make_job(team, cluster)
    _many_attempts(job, list(cluster.nodes.all()[:2]), 6)  # 2..6 restarted from scratch
    JobAttempt.objects.create(job=job, number=7, resume_step=300)
    JobAttempt.objects.create(job=job, number=9, resume_step=300)
    JobAttempt.objects.create(job=job, number=8, resume_step=0)
    marks = web(owner).get(f"/jobs/{job.pk}/live/").json()["charts"]["restarts"]
    assert marks == [
        {"step": 0, "attempts": [2, 3, 4, 5, 6, 8], "label": "6 attempts"},
        {"step": 300, "attempts": [7, 9], "label": "2 attempts"},
    ]
    JobAttempt.objects.filter(job=job, number__in=[8, 9]).delete()
    marks = web(owner).get(f"/jobs/{job.pk}/live/").json()["charts"]["restarts"]
    assert [m["label"] for m in marks] == ["attempts 2–6", "attempt 7"]
