"""The trainer's reporting endpoints (docs/trainer-protocol.md), over real
HTTP handling with real per-attempt tokens."""

import threading
import time

import pytest

from checkpoints.models import Checkpoint
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, JobEvent, RankStatus, TrainingJob
from tests.api_factories import make_attempt, worker_client


def url(attempt, endpoint):
    return f"/api/v1/worker/attempts/{attempt.pk}/{endpoint}"


def beat(rank=0, step=10, **extra):
    return {"rank": rank, "node": "cpu-a-0", "step": step, "samples_per_s": 64.0,
            "tokens_per_s": 8192.0, "step_time_s": 0.2, "gpu": None, **extra}


class TestHeartbeat:
    def test_it_records_the_rank_and_answers_with_directives(
        self, attempt, reporting_job, django_capture_on_commit_callbacks
    ):
        attempt, token = attempt
        with django_capture_on_commit_callbacks() as callbacks:
            resp = worker_client(token).post(url(attempt, "heartbeat"), beat(), format="json")
        assert resp.status_code == 200, resp.content
        assert resp.json() == {"directives": {"checkpoint_request": None, "stop": False,
                                              "checkpoint_interval_steps": None,
                                              "profile": None}}
        rank = RankStatus.objects.get(attempt=attempt)
        assert (rank.rank, rank.step, rank.node_name, rank.tokens_per_s) == (0, 10, "cpu-a-0",
                                                                            8192.0)
        attempt.refresh_from_db()
        reporting_job.refresh_from_db()
        assert attempt.last_step == 10 and attempt.first_step_at is not None
        assert attempt.last_heartbeat_at is not None
        assert reporting_job.current_step == 10 and reporting_job.progress["tokens_per_s"] == 8192.0
        # The attempt's first step takes the fast path to the reconciler.
        assert len(callbacks) == 1

    def test_it_never_lowers_the_step(self, attempt, reporting_job,
                                      django_capture_on_commit_callbacks):
        attempt, token = attempt
        client = worker_client(token)
        client.post(url(attempt, "heartbeat"), beat(step=50), format="json")
        with django_capture_on_commit_callbacks() as callbacks:
            client.post(url(attempt, "heartbeat"), beat(step=40), format="json")
        attempt.refresh_from_db()
        reporting_job.refresh_from_db()
        assert attempt.last_step == 50 and reporting_job.current_step == 50
        assert RankStatus.objects.get(attempt=attempt).step == 40
        assert callbacks == []  # not the first step any more

    def test_it_upserts_one_row_per_rank(self, attempt):
        attempt, token = attempt
        client = worker_client(token)
        for step in (1, 2, 3):
            for rank in (0, 1):
                client.post(url(attempt, "heartbeat"), beat(rank=rank, step=step), format="json")
        assert RankStatus.objects.filter(attempt=attempt).count() == 2
        assert set(RankStatus.objects.values_list("step", flat=True)) == {3}

    def test_it_carries_a_checkpoint_request_and_a_stop(self, attempt, reporting_job):
        attempt, token = attempt
        request_id = attempt.request_checkpoint("user:olivia")
        JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=attempt.created_at)
        resp = worker_client(token).post(url(attempt, "heartbeat"), beat(), format="json")
        assert resp.json()["directives"]["checkpoint_request"] == request_id
        assert resp.json()["directives"]["stop"] is True

    def test_an_ended_attempt_is_told_to_stop(self, reporting_job):
        attempt, token = make_attempt(reporting_job, state=JobAttempt.State.FAILED)
        resp = worker_client(token).post(url(attempt, "heartbeat"), beat(), format="json")
        assert resp.status_code == 403
        assert resp.json()["stop"] is True
        assert not RankStatus.objects.exists()

    @pytest.mark.parametrize("body", [
        {"step": 1}, {"rank": "0", "step": 1}, {"rank": 0, "step": -1},
        {"rank": 0, "step": True}, {"rank": 0, "step": 1, "tokens_per_s": "fast"},
        {"rank": 0, "step": 1, "gpu": [1]},
    ])
    def test_it_refuses_a_malformed_heartbeat(self, attempt, body):
        attempt, token = attempt
        resp = worker_client(token).post(url(attempt, "heartbeat"), body, format="json")
        assert resp.status_code == 400
        assert not RankStatus.objects.exists()


class TestMetrics:
    def batch(self, n=3, rank=0, name="loss"):
        now = time.time()
        return {"batch_id": "r0-1", "points": [
            {"rank": rank, "name": name, "step": s, "value": 2.0 - s / 100, "time": now}
            for s in range(1, n + 1)]}

    def test_a_batch_sent_twice_is_stored_once(self, attempt, reporting_job):
        attempt, token = attempt
        client = worker_client(token)
        first = client.post(url(attempt, "metrics"), self.batch(), format="json")
        again = client.post(url(attempt, "metrics"), self.batch(), format="json")
        assert first.status_code == again.status_code == 200
        assert first.json() == {"stored": 3, "duplicates": 0}
        assert again.json() == {"stored": 0, "duplicates": 3}
        points = MetricPoint.objects.filter(job=reporting_job, attempt=attempt)
        assert points.count() == 3
        assert sorted(points.values_list("step", "value")) == [(1, 1.99), (2, 1.98), (3, 1.97)]

    def test_a_batch_overlapping_a_stored_one_counts_only_the_new_points(self, attempt):
        attempt, token = attempt
        client = worker_client(token)
        client.post(url(attempt, "metrics"), self.batch(n=2), format="json")
        resp = client.post(url(attempt, "metrics"), self.batch(n=5), format="json")
        assert resp.json() == {"stored": 3, "duplicates": 2}
        assert MetricPoint.objects.filter(attempt=attempt).count() == 5

    def test_a_point_repeated_within_a_batch_is_stored_once(self, attempt):
        attempt, token = attempt
        body = self.batch(n=2)
        body["points"].append({**body["points"][0], "value": 9.0})
        resp = worker_client(token).post(url(attempt, "metrics"), body, format="json")
        assert resp.status_code == 200, resp.content
        assert resp.json() == {"stored": 2, "duplicates": 1}
        assert MetricPoint.objects.get(attempt=attempt, step=1).value == 1.99

    @pytest.mark.django_db(transaction=True)
    def test_two_copies_racing_count_each_point_as_new_once(self, attempt):
        from django.db import connection, transaction

        from jobs.metrics import ingest

        attempt, token = attempt
        body = self.batch(n=50)
        rows = ingest.rows(body["points"])
        replies = []

        def send():
            try:
                resp = worker_client(token).post(url(attempt, "metrics"), body, format="json")
                replies.append((resp.status_code, resp.json()))
            finally:
                connection.close()

        # The first copy's transaction is still open when the second
        # arrives: the second's INSERT waits on the unique key, and once the
        # first commits it skips every point as already stored.
        racer = threading.Thread(target=send)
        with transaction.atomic():
            first = ingest.store(attempt.job_id, attempt.pk, rows, received=len(rows))
            racer.start()
            racer.join(timeout=0.5)
            assert racer.is_alive(), "the second copy did not wait for the first"
        racer.join(timeout=60)
        assert (first.new, first.duplicates) == (50, 0)
        assert replies == [(200, {"stored": 0, "duplicates": 50})]
        assert MetricPoint.objects.filter(attempt=attempt).count() == 50

    @pytest.mark.django_db(transaction=True)
    def test_many_copies_sent_at_once_store_each_point_once(self, attempt):
        from django.db import connection

        attempt, token = attempt
        body = self.batch(n=200)
        start = threading.Barrier(6, timeout=30)
        replies = []

        def send():
            try:
                start.wait()
                resp = worker_client(token).post(url(attempt, "metrics"), body, format="json")
                replies.append((resp.status_code, resp.json()))
            finally:
                connection.close()

        threads = [threading.Thread(target=send) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert {code for code, _ in replies} == {200} and len(replies) == 6
        assert sum(r["stored"] for _, r in replies) == 200
        assert all(r["stored"] + r["duplicates"] == 200 for _, r in replies)
        assert MetricPoint.objects.filter(attempt=attempt).count() == 200
        # The rollups counted every point once too.
        from jobs.metrics.models import MetricRollup
        assert MetricRollup.objects.filter(attempt=attempt, level=16384).get().n == 200

    def test_a_batch_over_the_limit_gets_413(self, attempt):
        attempt, token = attempt
        resp = worker_client(token).post(url(attempt, "metrics"), self.batch(n=5001),
                                         format="json")
        assert resp.status_code == 413
        assert not MetricPoint.objects.exists()

    @pytest.mark.parametrize("point", [
        {"rank": 0, "name": "loss", "step": 1},
        {"rank": 0, "name": "loss", "step": 1, "value": "2.0"},
        {"rank": 0, "name": "", "step": 1, "value": 2.0},
        {"rank": 0, "name": "loss", "step": -3, "value": 2.0},
        {"rank": 0, "name": "x" * 65, "step": 1, "value": 2.0},
        "loss=2.0",
    ])
    def test_a_bad_point_refuses_the_whole_batch(self, attempt, point):
        attempt, token = attempt
        body = self.batch()
        body["points"].append(point)
        resp = worker_client(token).post(url(attempt, "metrics"), body, format="json")
        assert resp.status_code == 400
        assert any(key.startswith("points[3]") for key in resp.json())
        assert not MetricPoint.objects.exists()

    @pytest.mark.parametrize("time_", [1e300, -1e15, -1, 253402300800])
    def test_a_time_out_of_range_is_a_400_naming_the_field(self, attempt, time_):
        attempt, token = attempt
        body = self.batch()
        body["points"][1]["time"] = time_
        resp = worker_client(token).post(url(attempt, "metrics"), body, format="json")
        assert resp.status_code == 400, resp.content
        assert "points[1].time" in resp.json()
        assert not MetricPoint.objects.exists()

    @pytest.mark.parametrize("field", ["time", "value"])
    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
    def test_a_number_that_is_not_finite_is_a_400(self, attempt, field, literal):
        attempt, token = attempt
        other = "value" if field == "time" else "time"
        raw = ('{"points": [{"rank": 0, "name": "loss", "step": 1, '
               f'"{field}": {literal}, "{other}": 1.0}}]}}')
        resp = worker_client(token).post(url(attempt, "metrics"), raw,
                                         content_type="application/json")
        assert resp.status_code == 400, resp.content
        assert not MetricPoint.objects.exists()

    def test_an_ended_attempt_may_still_report_late_metrics(self, reporting_job):
        attempt, token = make_attempt(reporting_job, state=JobAttempt.State.SUCCEEDED)
        resp = worker_client(token).post(url(attempt, "metrics"), self.batch(), format="json")
        assert resp.status_code == 200
        assert MetricPoint.objects.count() == 3


class TestCheckpoints:
    body = {"step": 200, "uri": "file:///tmp/ckpt/step-200", "bytes": 123456,
            "manifest_sha256": "ab" * 32, "save_seconds": 1.8, "blocking_seconds": 0.05,
            "emergency": False, "request_id": None}

    def test_it_records_a_committed_checkpoint_once(
        self, attempt, reporting_job, django_capture_on_commit_callbacks
    ):
        attempt, token = attempt
        client = worker_client(token)
        with django_capture_on_commit_callbacks() as callbacks:
            first = client.post(url(attempt, "checkpoints"), self.body, format="json")
        again = client.post(url(attempt, "checkpoints"), self.body, format="json")
        assert (first.status_code, again.status_code) == (201, 200)
        checkpoint = Checkpoint.objects.get(job=reporting_job)
        assert (checkpoint.step, checkpoint.state, checkpoint.attempt) == (200, "committed",
                                                                          attempt)
        assert (checkpoint.bytes, checkpoint.save_seconds) == (123456, 1.8)
        assert len(callbacks) == 1

    def test_a_later_attempt_rewriting_a_step_resets_its_verification(self, attempt, reporting_job):
        first, token = attempt
        worker_client(token).post(url(first, "checkpoints"), self.body, format="json")
        Checkpoint.objects.update(state="verified")
        second, token2 = make_attempt(reporting_job)
        body = {**self.body, "manifest_sha256": "cd" * 32}
        resp = worker_client(token2).post(url(second, "checkpoints"), body, format="json")
        assert resp.status_code == 200
        checkpoint = Checkpoint.objects.get(job=reporting_job)
        assert (checkpoint.attempt, checkpoint.state) == (second, "committed")
        assert checkpoint.manifest_sha256 == "cd" * 32

    @pytest.mark.parametrize("change", [{"step": "200"}, {"uri": ""}, {"uri": None},
                                        {"bytes": -1}, {"emergency": "no"}])
    def test_it_refuses_a_malformed_report(self, attempt, change):
        attempt, token = attempt
        resp = worker_client(token).post(url(attempt, "checkpoints"), {**self.body, **change},
                                         format="json")
        assert resp.status_code == 400
        assert not Checkpoint.objects.exists()


class TestEvents:
    @pytest.mark.parametrize(("kind", "recorded"), [
        ("started", "TrainerStarted"), ("resumed", "TrainerResumed"),
        ("crashed", "TrainerCrashed"), ("finished", "TrainerFinished"),
        ("checkpoint_skipped", "TrainerCheckpointSkipped"),
        ("emergency_checkpoint", "TrainerEmergencyCheckpoint"),
    ])
    def test_it_puts_trainer_events_on_the_timeline(self, attempt, reporting_job, kind, recorded):
        attempt, token = attempt
        RankStatus.objects.create(attempt=attempt, rank=1, node_name="cpu-a-1",
                                  last_heartbeat_at=attempt.created_at)
        resp = worker_client(token).post(
            url(attempt, "events"),
            {"kind": kind, "rank": 1, "message": "hello", "data": {"step": 7}}, format="json",
        )
        assert resp.status_code == 201, resp.content
        event = JobEvent.objects.get(job=reporting_job)
        assert (event.kind, event.actor, event.message) == (recorded, "worker:rank1@cpu-a-1",
                                                            "hello")
        assert event.evidence == {"step": 7} and event.attempt == attempt

    def test_a_crash_takes_the_fast_path(self, attempt, django_capture_on_commit_callbacks):
        attempt, token = attempt
        with django_capture_on_commit_callbacks() as callbacks:
            worker_client(token).post(url(attempt, "events"), {"kind": "crashed", "rank": 0},
                                      format="json")
        assert len(callbacks) == 1

    @pytest.mark.parametrize("body", [{"rank": 0}, {"kind": "Started!"}, {"kind": 3},
                                      {"kind": "started", "data": [1]}])
    def test_it_refuses_a_malformed_event(self, attempt, body):
        attempt, token = attempt
        resp = worker_client(token).post(url(attempt, "events"), body, format="json")
        assert resp.status_code == 400
        assert not JobEvent.objects.exists()

    def test_an_event_resent_with_its_key_is_stored_once(self, attempt, reporting_job):
        # A rank resends an event whose reply it never got (a timeout, a
        # restarting web): the first send may well have been stored.
        attempt, token = attempt
        body = {"kind": "started", "rank": 0, "data": {"world_size": 2}, "key": "j1-a1-r0-9f-0"}
        first = worker_client(token).post(url(attempt, "events"), body, format="json")
        again = worker_client(token).post(url(attempt, "events"), body, format="json")

        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json() == again.json()
        assert list(JobEvent.objects.filter(job=reporting_job).values_list("kind", "key")) == [
            ("TrainerStarted", "j1-a1-r0-9f-0")]

    def test_events_without_a_key_or_with_other_keys_are_each_stored(self, attempt, reporting_job):
        attempt, token = attempt
        for key in (None, None, "k-1", "k-2"):
            body = {"kind": "tick", "rank": 0, **({"key": key} if key else {})}
            assert worker_client(token).post(url(attempt, "events"), body,
                                             format="json").status_code == 201
        assert JobEvent.objects.filter(job=reporting_job, kind="TrainerTick").count() == 4


class TestWorkerAuth:
    @pytest.mark.parametrize("endpoint", ["heartbeat", "metrics", "checkpoints", "events"])
    def test_another_attempts_token_is_forbidden(self, reporting_job, endpoint):
        mine, _ = make_attempt(reporting_job)
        _, theirs = make_attempt(reporting_job)
        resp = worker_client(theirs).post(url(mine, endpoint), {}, format="json")
        assert resp.status_code == 403

    @pytest.mark.parametrize("endpoint", ["heartbeat", "metrics", "checkpoints", "events"])
    def test_a_persons_token_is_forbidden(self, api, owner, attempt, endpoint):
        attempt, _ = attempt
        resp = api(owner).post(url(attempt, endpoint), {}, format="json")
        assert resp.status_code == 403

    @pytest.mark.parametrize("header", [None, "Bearer rgw_1_nope", "Bearer rgw_x",
                                        "Bearer rgw_999999_abc"])
    def test_no_or_a_bad_token_is_unauthorised(self, attempt, header):
        from rest_framework.test import APIClient

        attempt, _ = attempt
        client = APIClient()
        if header:
            client.credentials(HTTP_AUTHORIZATION=header.replace("_1_", f"_{attempt.pk}_"))
        resp = client.post(url(attempt, "heartbeat"), beat(), format="json")
        assert resp.status_code == 401
        assert not RankStatus.objects.exists()

    def test_a_worker_token_is_refused_on_peoples_endpoints(self, attempt, reporting_job):
        attempt, token = attempt
        client = worker_client(token)
        assert client.get("/api/v1/jobs/").status_code == 401
        assert client.get(f"/api/v1/jobs/{reporting_job.pk}/").status_code == 401
        assert client.post(f"/api/v1/jobs/{reporting_job.pk}/cancel/").status_code == 401
        reporting_job.refresh_from_db()
        assert reporting_job.cancel_requested_at is None
        assert TrainingJob.objects.get().phase == "running"
