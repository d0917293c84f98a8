"""Reading and acting on jobs: scoping, filters, pagination, cancel,
checkpoint-now and restart."""

import pytest

from jobs.models import JobAttempt, JobEvent, TrainingJob
from tests.api_factories import make_attempt, make_checkpoint, make_job


@pytest.fixture
def jobs(team, other_team, cluster, owner, outsider):
    mine = [make_job(team, cluster, owner, name=f"mine-{i}") for i in range(3)]
    theirs = make_job(other_team, cluster, outsider, name="theirs")
    return mine, theirs


class TestList:
    def test_a_member_sees_only_the_teams_jobs_newest_first(self, api, teammate, jobs):
        mine, _ = jobs
        resp = api(teammate).get("/api/v1/jobs/")
        assert resp.status_code == 200
        assert [j["id"] for j in resp.data["results"]] == [j.pk for j in reversed(mine)]
        assert "count" not in resp.data  # counted only when asked
        assert api(teammate).get("/api/v1/jobs/?count=true").data["count"] == 3

    def test_an_operator_sees_every_job(self, api, operator, jobs):
        assert api(operator).get("/api/v1/jobs/?count=true").data["count"] == 4

    def test_it_filters_by_team_phase_and_cluster(self, api, operator, jobs):
        mine, theirs = jobs
        TrainingJob.objects.filter(pk=mine[0].pk).update(phase="running")
        client = api(operator)
        assert [j["id"] for j in client.get("/api/v1/jobs/?team=speech").data["results"]] == [
            theirs.pk]
        assert [j["id"] for j in client.get("/api/v1/jobs/?phase=running").data["results"]] == [
            mine[0].pk]
        assert client.get("/api/v1/jobs/?cluster=cpu-a&count=1").data["count"] == 4
        assert client.get("/api/v1/jobs/?cluster=elsewhere").data["results"] == []
        assert client.get("/api/v1/jobs/?phase=dancing").status_code == 400

    def test_a_member_filtering_by_another_team_sees_nothing(self, api, owner, jobs):
        assert api(owner).get("/api/v1/jobs/?team=speech").data["results"] == []

    def test_it_paginates_with_limit_and_offset(self, api, owner, jobs):
        mine, _ = jobs
        page = api(owner).get("/api/v1/jobs/?limit=2&offset=1&count=true").data
        assert page["count"] == 3
        assert [j["id"] for j in page["results"]] == [mine[1].pk, mine[0].pk]
        assert page["next"] is None and page["previous"] is not None


class TestDetail:
    def test_it_shows_spec_and_status(self, api, owner, jobs):
        job = jobs[0][0]
        data = api(owner).get(f"/api/v1/jobs/{job.pk}/").data
        for key in ("phase", "pending_reason", "conditions", "current_step", "progress",
                    "last_error", "restart_counts", "checkpoint_interval_steps",
                    "checkpoint_interval_inputs", "observed_generation", "generation",
                    "created_at", "admitted_at", "started_at", "finished_at", "world_size",
                    "hyperparameters", "restart_budgets", "url", "team", "cluster", "pool"):
            assert key in data
        assert (data["team"], data["cluster"], data["pool"], data["world_size"]) == (
            "vision", "cpu-a", "default", 2)

    def test_an_outsider_gets_404_for_another_teams_job(self, api, outsider, jobs):
        job = jobs[0][0]
        assert api(outsider).get(f"/api/v1/jobs/{job.pk}/").status_code == 404
        assert api(outsider).get("/api/v1/jobs/999999/").status_code == 404


class TestCancel:
    def test_a_pending_job_is_cancelled_at_once(self, api, teammate, jobs):
        job = jobs[0][0]
        resp = api(teammate).post(f"/api/v1/jobs/{job.pk}/cancel/")
        assert resp.status_code == 200 and resp.data["phase"] == "cancelled"
        job.refresh_from_db()
        assert job.phase == "cancelled" and job.cancel_requested_at is not None
        kinds = list(JobEvent.objects.filter(job=job).values_list("kind", "actor"))
        assert kinds == [("CancelRequested", "user:tom"), ("Cancelled", "user:tom")]

    def test_a_repeated_cancel_is_200_with_no_new_event(self, api, owner, jobs):
        job = jobs[0][0]
        TrainingJob.objects.filter(pk=job.pk).update(phase="running")
        client = api(owner)
        first = client.post(f"/api/v1/jobs/{job.pk}/cancel/")
        events = JobEvent.objects.filter(job=job).count()
        second = client.post(f"/api/v1/jobs/{job.pk}/cancel/")
        assert first.status_code == second.status_code == 200
        assert JobEvent.objects.filter(job=job).count() == events == 1
        job.refresh_from_db()
        # A running job keeps running until the reconciler stops its ranks.
        assert job.phase == "running" and job.cancel_requested_at is not None

    @pytest.mark.parametrize("phase", ["succeeded", "failed"])
    def test_cancelling_an_ended_job_is_409(self, api, owner, jobs, phase):
        job = jobs[0][0]
        TrainingJob.objects.filter(pk=job.pk).update(phase=phase)
        resp = api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/")
        assert resp.status_code == 409
        assert resp.data["current"] == phase
        assert not JobEvent.objects.filter(job=job).exists()

    def test_an_outsider_cannot_cancel(self, api, outsider, jobs):
        job = jobs[0][0]
        assert api(outsider).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404
        job.refresh_from_db()
        assert job.cancel_requested_at is None


class TestCheckpointNow:
    def test_it_asks_the_running_attempt(self, api, owner, jobs):
        job = jobs[0][0]
        attempt, _ = make_attempt(job)
        resp = api(owner).post(f"/api/v1/jobs/{job.pk}/checkpoint/")
        assert resp.status_code == 202
        attempt.refresh_from_db()
        assert attempt.checkpoint_request_id == resp.data["request_id"]
        assert JobEvent.objects.get(job=job).kind == "CheckpointRequested"
        again = api(owner).post(f"/api/v1/jobs/{job.pk}/checkpoint/")
        assert again.data["request_id"] != resp.data["request_id"]

    def test_it_is_409_when_no_attempt_runs(self, api, owner, jobs):
        job = jobs[0][0]
        make_attempt(job, state=JobAttempt.State.FAILED)
        assert api(owner).post(f"/api/v1/jobs/{job.pk}/checkpoint/").status_code == 409
        assert not JobEvent.objects.filter(job=job).exists()


class TestRestart:
    def test_it_restarts_from_a_committed_step(self, api, owner, jobs,
                                                django_capture_on_commit_callbacks):
        job = jobs[0][0]
        TrainingJob.objects.filter(pk=job.pk).update(phase="running")
        make_checkpoint(job, 100)
        with django_capture_on_commit_callbacks() as callbacks:
            resp = api(owner).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 100},
                                   format="json")
        assert resp.status_code == 200, resp.content
        job.refresh_from_db()
        assert (job.restart_from_step, job.generation) == (100, 2)
        event = JobEvent.objects.get(job=job)
        assert (event.kind, event.evidence) == ("RestartRequested", {"from_step": 100})
        assert len(callbacks) == 1

    @pytest.mark.parametrize(("body", "status"), [
        ({"from_step": 150}, 409), ({"from_step": 50}, 409), ({"from_step": "100"}, 400),
        ({}, 400), ({"from_step": 100, "force": True}, 400)])
    def test_it_refuses_a_step_without_a_loadable_checkpoint(self, api, owner, jobs, body,
                                                             status):
        """A malformed body is 400; a well-formed step the job has no
        checkpoint at is the job's state, 409."""
        job = jobs[0][0]
        make_checkpoint(job, 100)
        make_checkpoint(job, 50, state="corrupt")
        resp = api(owner).post(f"/api/v1/jobs/{job.pk}/restart/", body, format="json")
        assert resp.status_code == status
        if status == 409:
            assert "no committed or verified checkpoint at step" in resp.data["detail"]
        job.refresh_from_db()
        assert (job.restart_from_step, job.generation) == (None, 1)

    def test_an_ended_job_with_nothing_to_resume_is_409(self, api, owner, jobs):
        job = jobs[0][0]
        make_checkpoint(job, 100, state="corrupt")
        TrainingJob.objects.filter(pk=job.pk).update(phase="succeeded")
        resp = api(owner).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 100},
                               format="json")
        assert resp.status_code == 409
        assert "no committed or verified checkpoint to resume from" in resp.data["detail"]
        assert not JobEvent.objects.filter(job=job).exists()


def _ended(job, phase="failed"):
    TrainingJob.objects.filter(pk=job.pk).update(
        phase=phase, finished_at="2026-01-01T00:00:00Z", last_error="hardware budget spent",
        restart_counts={"hardware": 6}, budget_spent={"hardware": 6},
        restart_marks={"hardware": {"step": 150, "at": 0}}, current_step=150,
        conditions=[{"type": "LastFailure", "attempt": 7}])
    make_checkpoint(job, 100)
    make_checkpoint(job, 50, state="verified")
    make_checkpoint(job, 120, state="corrupt")


class TestRerun:
    """An ended job runs again from a chosen checkpoint: a new run of the
    same job, asked by its owner."""

    @pytest.mark.parametrize("phase", ["failed", "cancelled", "succeeded"])
    def test_its_owner_reruns_an_ended_job_from_a_chosen_step(
            self, api, owner, jobs, phase, django_capture_on_commit_callbacks):
        job = jobs[0][0]
        _ended(job, phase)
        with django_capture_on_commit_callbacks() as callbacks:
            resp = api(owner).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 50},
                                   format="json")
        assert resp.status_code == 200, resp.content
        assert resp.data["phase"] == "queued"
        assert resp.data["restarts"]["hardware"] == {"spent": 0, "budget": 5, "in_all": 0}
        job.refresh_from_db()
        assert (job.phase, job.restart_from_step, job.generation) == ("queued", 50, 2)
        assert (job.restart_counts, job.budget_spent, job.restart_marks) == ({}, {}, {})
        assert (job.finished_at, job.last_error, job.conditions) == (None, "", [])
        event = JobEvent.objects.get(job=job)
        assert (event.kind, event.actor, event.from_phase, event.to_phase) == (
            "Rerun", "user:olivia", phase, "queued")
        assert event.evidence["from_step"] == 50 and event.evidence["was"] == phase
        # An admission pass of the cluster and the job's reconcile.
        assert len(callbacks) == 2

    def test_an_operator_may_rerun_it(self, api, operator, jobs):
        job = jobs[0][0]
        _ended(job)
        resp = api(operator).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 100},
                                  format="json")
        assert resp.status_code == 200
        assert JobEvent.objects.get(job=job, kind="Rerun").actor == "user:opal"

    @pytest.mark.parametrize(("body", "status"), [
        ({"from_step": 120}, 409), ({"from_step": 75}, 409), ({"from_step": "100"}, 400),
        ({}, 400), ({"from_step": -1}, 400)])
    def test_a_step_without_a_loadable_checkpoint_is_refused(self, api, owner, jobs, body,
                                                             status):
        job = jobs[0][0]
        _ended(job)
        resp = api(owner).post(f"/api/v1/jobs/{job.pk}/restart/", body, format="json")
        assert resp.status_code == status
        assert "from_step" in resp.data if status == 400 else "step" in resp.data["detail"]
        job.refresh_from_db()
        assert (job.phase, job.generation) == ("failed", 1)

    def test_a_teammate_may_not_rerun_the_owners_job(self, api, teammate, jobs):
        job = jobs[0][0]
        _ended(job)
        resp = api(teammate).post(f"/api/v1/jobs/{job.pk}/restart/", {"from_step": 100},
                                  format="json")
        assert resp.status_code == 403
        job.refresh_from_db()
        assert job.phase == "failed" and not JobEvent.objects.filter(job=job).exists()

    def test_an_outsider_and_an_anonymous_caller_do_not_find_it(self, api, outsider, jobs):
        job = jobs[0][0]
        _ended(job)
        url = f"/api/v1/jobs/{job.pk}/restart/"
        assert api(outsider).post(url, {"from_step": 100}, format="json").status_code == 404
        assert api(None).post(url, {"from_step": 100}, format="json").status_code in (401, 403)
        job.refresh_from_db()
        assert job.phase == "failed"
