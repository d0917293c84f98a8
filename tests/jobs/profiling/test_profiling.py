"""Profiling on demand, the control plane's side: asking for a profile
(API), the directive it becomes, the ranks' trace reports (worker API), and
the traces' listing and download, scoped to the job's team."""

import gzip
import json

import pytest
from regatta.storage import profile_key

from jobs.models import NO_HEARTBEATS, JobAttempt, JobEvent, TrainingJob
from jobs.profiling import requests as profile_requests
from jobs.profiling.models import ProfileTrace
from tests.api_factories import make_attempt, make_job, worker_client
from tests.conftest import client_for
from tests.profile_factories import TRACE, write_trace


@pytest.fixture
def job_on_disk(team, cluster, owner, fleet_dirs):
    """Running, with its storage in the test's own checkpoint root."""
    return make_job(team, cluster, owner, phase="running",
                    storage_uri=str(fleet_dirs / "checkpoints" / "vision" / "job"))


@pytest.fixture
def attempt(job_on_disk):
    return make_attempt(job_on_disk)


def ask(user, job, body):
    return client_for(user).post(f"/api/v1/jobs/{job.pk}/profile/", body, format="json")


def report(attempt, token, **fields):
    body = {"request_id": attempt.profile_request_id, "rank": 0, "start_step": 11, "steps": 5,
            "bytes": 100, **fields}
    body.setdefault("uri", "file://" + attempt.job.storage_uri + "/" + profile_key(
        body["start_step"], body["request_id"], body["rank"]))
    return worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/profiles", body,
                                     format="json")


class TestAskingForAProfile:
    def test_it_becomes_a_directive_and_an_event(self, job_on_disk, attempt, teammate):
        attempt, token = attempt
        resp = ask(teammate, job_on_disk, {"steps": 5})

        assert resp.status_code == 202, resp.content
        body = resp.json()
        assert body["attempt"] == attempt.pk and body["steps"] == 5 and body["created"] is True
        attempt.refresh_from_db()
        assert attempt.profile_request_id == body["request_id"] and attempt.profile_steps == 5
        event = JobEvent.objects.get(job=job_on_disk, kind="ProfileRequested")
        assert event.evidence == {"request_id": body["request_id"], "steps": 5}
        assert event.actor == "user:tom" and event.attempt_id == attempt.pk
        beat = worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/heartbeat",
                                         {"rank": 1, "node": "cpu-a-0", "step": 10},
                                         format="json")
        assert beat.json()["directives"]["profile"] == {"request_id": body["request_id"],
                                                        "steps": 5}

    def test_asking_again_while_it_is_pending_returns_it_and_writes_nothing(
            self, job_on_disk, attempt, owner, teammate):
        first = ask(owner, job_on_disk, {"steps": 5}).json()
        again = ask(teammate, job_on_disk, {"steps": 20})

        assert again.status_code == 200
        assert again.json() == {**first, "created": False}  # the pending one, 5 steps
        assert JobEvent.objects.filter(kind="ProfileRequested").count() == 1

    def test_once_a_trace_arrived_the_next_ask_is_a_new_profile(self, job_on_disk, attempt, owner):
        attempt, token = attempt
        first = ask(owner, job_on_disk, {"steps": 5}).json()
        attempt.refresh_from_db()
        assert report(attempt, token).status_code == 201

        second = ask(owner, job_on_disk, {"steps": 2})

        assert second.status_code == 202 and second.json()["request_id"] != first["request_id"]
        assert JobEvent.objects.filter(kind="ProfileRequested").count() == 2

    @pytest.mark.parametrize(("body", "field"), [
        ({}, "steps"), ({"steps": 0}, "steps"), ({"steps": 51}, "steps"),
        ({"steps": "5"}, "steps"), ({"steps": True}, "steps"), ({"steps": 2.5}, "steps"),
        ({"steps": None}, "steps"), ({"steps": 5, "ranks": [0]}, "ranks"),
    ])
    def test_bad_input_is_400_naming_the_field_and_writes_nothing(
            self, job_on_disk, attempt, owner, body, field):
        resp = ask(owner, job_on_disk, body)

        assert resp.status_code == 400
        assert field in resp.json()
        assert not JobEvent.objects.filter(kind="ProfileRequested").exists()
        assert JobAttempt.objects.get(pk=attempt[0].pk).profile_request_id == ""

    @pytest.mark.parametrize("state", ["starting", "succeeded", "failed"])
    def test_a_job_without_a_running_attempt_is_409(self, job_on_disk, owner, state):
        make_attempt(job_on_disk, state=state)

        resp = ask(owner, job_on_disk, {"steps": 5})

        assert resp.status_code == 409, resp.content
        assert "running" in resp.json()["detail"]
        assert not JobEvent.objects.filter(kind="ProfileRequested").exists()

    def test_a_program_that_sends_no_heartbeats_is_409_as_it_would_never_hear_it(
            self, job_on_disk, attempt, owner):
        TrainingJob.objects.filter(pk=job_on_disk.pk).update(
            entrypoint=["python", "train.py"],
            conditions=[{"type": NO_HEARTBEATS, "attempt": attempt[0].pk}])

        resp = ask(owner, job_on_disk, {"steps": 5})

        assert resp.status_code == 409 and "no heartbeats" in resp.json()["detail"]
        assert JobAttempt.objects.get(pk=attempt[0].pk).profile_request_id == ""

    def test_another_teams_job_is_not_found(self, job_on_disk, attempt, outsider):
        assert ask(outsider, job_on_disk, {"steps": 5}).status_code == 404
        assert JobAttempt.objects.get(pk=attempt[0].pk).profile_request_id == ""


class TestATraceReport:
    @pytest.fixture
    def asked(self, attempt, owner, job_on_disk):
        attempt, token = attempt
        profile_requests.request(attempt, 5, "user:olivia")
        return attempt, token

    def test_each_rank_is_stored_once_and_the_first_writes_the_event(self, asked):
        attempt, token = asked

        assert report(attempt, token, rank=0).status_code == 201
        assert report(attempt, token, rank=1).status_code == 201
        repeat = report(attempt, token, rank=1)

        assert repeat.status_code == 200 and repeat.json()["created"] is False
        traces = ProfileTrace.objects.filter(attempt=attempt).order_by("rank")
        assert [(t.rank, t.start_step, t.steps, t.end_step) for t in traces] == [
            (0, 11, 5, 15), (1, 11, 5, 15)]
        assert traces[0].path == f"profiles/step-11-{attempt.profile_request_id}/rank-0.json.gz"
        (event,) = JobEvent.objects.filter(kind="ProfileWritten")
        assert "steps 11..15" in event.message
        assert not profile_requests.pending(attempt)

    @pytest.mark.parametrize(("fields", "field"), [
        ({"uri": "file:///etc/passwd"}, "uri"),
        ({"uri": "file:///tmp/elsewhere/profiles/step-11-x/rank-0.json.gz"}, "uri"),
        ({"start_step": 12, "uri": None}, "uri"),  # the path names step 11
        ({"request_id": "not-asked"}, "request_id"),
        ({"rank": 2}, "rank"),  # the gang has 2 ranks
        ({"steps": 51}, "steps"),
        ({"flops": 1}, "flops"),
        ({"job_id": 999_999}, "job_id"),
    ])
    def test_a_bad_report_is_400_naming_the_field_and_stores_nothing(
            self, asked, fields, field):
        attempt, token = asked
        if fields.get("uri", "") is None:  # the right path for another step than reported
            fields["uri"] = "file://" + attempt.job.storage_uri + "/" + profile_key(
                11, attempt.profile_request_id, 0)
        resp = report(attempt, token, **fields)

        assert resp.status_code == 400, resp.content
        assert field in resp.json()
        assert not ProfileTrace.objects.exists()

    def test_another_attempts_token_cannot_report_for_it(self, asked, job_on_disk):
        attempt, _ = asked
        _, other_token = make_attempt(job_on_disk, number=9)
        assert report(attempt, other_token).status_code == 403


class TestDownloadingTraces:
    def test_the_team_lists_and_downloads_each_ranks_trace(self, job_on_disk, attempt, teammate):
        attempt, _ = attempt
        for rank in (0, 1):
            write_trace(attempt, rank)
        api = client_for(teammate)

        listing = api.get(f"/api/v1/jobs/{job_on_disk.pk}/profiles/")

        assert listing.status_code == 200
        traces = listing.json()["results"]
        assert sorted(t["rank"] for t in traces) == [0, 1]
        for t in traces:
            assert (t["start_step"], t["steps"], t["request_id"]) == (7, 3, "feedc0de")
            resp = api.get(t["url"])
            assert resp.status_code == 200
            data = b"".join(resp.streaming_content)
            assert len(data) == t["bytes"] == int(resp["Content-Length"])
            assert json.loads(gzip.decompress(data)) == TRACE
            assert f"rank-{t['rank']}.json.gz" in resp["Content-Disposition"]

    def test_the_listing_pages_newest_profile_first_and_narrows_to_one(self, job_on_disk, attempt,
                                                                      owner):
        attempt, _ = attempt
        write_trace(attempt, 0, request_id="old0", start_step=3)
        for rank in (1, 0):
            write_trace(attempt, rank, request_id="new1", start_step=30)
        api = client_for(owner)

        page = api.get(f"/api/v1/jobs/{job_on_disk.pk}/profiles/?limit=2").json()
        one = api.get(f"/api/v1/jobs/{job_on_disk.pk}/profiles/?request_id=old0").json()

        assert page["count"] == 3 and page["next"]
        assert [(t["request_id"], t["rank"]) for t in page["results"]] == [("new1", 0),
                                                                           ("new1", 1)]
        assert [(t["request_id"], t["start_step"]) for t in one["results"]] == [("old0", 3)]

    def test_another_team_sees_no_trace(self, job_on_disk, attempt, outsider, operator):
        trace = write_trace(attempt[0], 0)
        url = f"/api/v1/jobs/{job_on_disk.pk}/profiles/{trace.pk}/file"
        listing = f"/api/v1/jobs/{job_on_disk.pk}/profiles/"
        assert client_for(outsider).get(listing).status_code == 404
        assert client_for(outsider).get(url).status_code == 404
        assert client_for(operator).get(url).status_code == 200

    def test_a_trace_of_another_job_is_not_found_under_this_one(
            self, job_on_disk, attempt, team, cluster, owner, fleet_dirs):
        other = make_job(team, cluster, owner, phase="running", name="other",
                         storage_uri=str(fleet_dirs / "checkpoints" / "vision" / "other"))
        trace = write_trace(make_attempt(other)[0], 0)
        resp = client_for(owner).get(f"/api/v1/jobs/{job_on_disk.pk}/profiles/{trace.pk}/file")
        assert resp.status_code == 404

    @pytest.mark.parametrize("path", ["../../../../etc/passwd", "/etc/passwd",
                                      "profiles/step-7-x/rank-0.json.gz"])
    def test_a_row_pointing_outside_or_at_nothing_is_404(self, job_on_disk, attempt, owner, path):
        trace = write_trace(attempt[0], 0)
        ProfileTrace.objects.filter(pk=trace.pk).update(path=path)
        resp = client_for(owner).get(f"/api/v1/jobs/{job_on_disk.pk}/profiles/{trace.pk}/file")
        assert resp.status_code == 404
