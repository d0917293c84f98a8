"""The worker fast path (jobs/worker_api/views/fast.py) as the WSGI server calls it:
`controlplane.wsgi.application`, not Django's test client (which enters
below it). A plain success is answered by the fast path; every other
request must reach the full stack with its body intact and get exactly the
answer the full stack alone gives."""

from __future__ import annotations

import json
import threading
from io import BytesIO
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.util import setup_testing_defaults

import pytest
from django.core import signals
from django.db import close_old_connections, connection, connections
from django.test.utils import CaptureQueriesContext
from regatta.reporting import Reporter

from accounts.models import ApiToken
from controlplane.wsgi import application, django_application
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, RankStatus
from jobs.worker_api.views.fast import WorkerFastPath
from tests.api_factories import make_attempt, make_job
from tests.support.waiting import eventually


class Recorder:
    """The full stack, noting each request it was handed and its body."""

    def __init__(self):
        self.bodies: list[bytes] = []

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        self.bodies.append(body)
        environ["wsgi.input"] = BytesIO(body)
        return django_application(environ, start_response)


def call(app, path: str, body, token: str | None = None, *,
         content_type: str = "application/json", host: str = "testserver") -> tuple[int, dict]:
    """One request through `app`, as a WSGI server makes it. Like Django's
    test client, it keeps the request signals from closing the connection
    that holds the test's transaction."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        return _call(app, path, body, token, content_type, host)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _call(app, path, body, token, content_type, host="testserver"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_TYPE": content_type,
               "CONTENT_LENGTH": str(len(raw)), "wsgi.input": BytesIO(raw),
               "SERVER_NAME": "testserver", "HTTP_HOST": host}
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    setup_testing_defaults(environ)
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = int(status.split()[0]), dict(headers)

    content = b"".join(app(environ, start_response))
    is_json = answer["headers"].get("Content-Type", "").startswith("application/json")
    return answer["status"], json.loads(content) if is_json else content


def metrics_url(attempt):
    return f"/api/v1/worker/attempts/{attempt.pk}/metrics"


def beat_url(attempt):
    return f"/api/v1/worker/attempts/{attempt.pk}/heartbeat"


def batch(*points, **extra):
    return {"batch_id": "b1", "points": [{"rank": r, "name": n, "step": s, "value": v}
                                         for r, n, s, v in points], **extra}


def beat(**extra):
    return {"rank": 0, "node": "cpu-a-0", "step": 10, "samples_per_s": 64.0,
            "tokens_per_s": 8192.0, "step_time_s": 0.2, "gpu": {"util": 97, "mem_gb": 61.5},
            **extra}


class TestPlainSuccessIsAnsweredAhead:
    def test_a_metric_batch_is_stored_once_in_one_statement(self, attempt):
        attempt, token = attempt
        full = Recorder()
        app = WorkerFastPath(full)
        body = batch((0, "loss", 1, 2.5), (0, "loss", 2, 2.25), (1, "loss", 1, 2.6))
        with CaptureQueriesContext(connection) as queries:
            status, reply = call(app, metrics_url(attempt), body, token)
        assert (status, reply) == (200, {"stored": 3, "duplicates": 0})
        assert full.bodies == []
        # PostgreSQL: the attempt's check, points, rollups and names in one
        # statement; SQLite runs them one by one (jobs/metrics/ingest.py), in a
        # savepoint here.
        writes = [q for q in queries.captured_queries
                  if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
        assert len(writes) == (1 if connection.vendor == "postgresql" else 4)
        # A retry of the same batch stores nothing twice, on either path.
        assert call(app, metrics_url(attempt), body, token) == (200, {"stored": 0,
                                                                      "duplicates": 3})
        assert call(django_application, metrics_url(attempt), body, token) == (
            200, {"stored": 0, "duplicates": 3})
        assert sorted(MetricPoint.objects.filter(attempt=attempt).values_list(
            "rank", "step", "value")) == [(0, 1, 2.5), (0, 2, 2.25), (1, 1, 2.6)]

    def test_a_heartbeat_answers_as_the_full_stack_does(self, attempt, reporting_job):
        attempt, token = attempt
        full = Recorder()
        request_id = attempt.request_checkpoint("user:olivia")
        fast = call(WorkerFastPath(full), beat_url(attempt), beat(), token)
        assert full.bodies == []
        assert fast == call(django_application, beat_url(attempt), beat(), token)
        assert fast == (200, {"directives": {"checkpoint_request": request_id, "stop": False,
                                             "checkpoint_interval_steps": None,
                                             "profile": None}})
        rank = RankStatus.objects.get(attempt=attempt)
        assert (rank.step, rank.node_name, rank.gpu) == (10, "cpu-a-0",
                                                         {"util": 97, "mem_gb": 61.5})
        reporting_job.refresh_from_db()
        assert reporting_job.current_step == 10 and reporting_job.progress["tokens_per_s"] == 8192.0

    def test_the_served_application_is_the_fast_path(self):
        assert isinstance(application, WorkerFastPath)
        assert application.app is django_application


def _bad_metrics(attempt, other, token, other_token, person):
    """(name, path, body, token, content type) of requests the fast path must hand on."""
    good = batch((0, "loss", 1, 1.0))
    url = metrics_url(attempt)
    return [
        ("no token", url, good, None, "application/json"),
        ("another attempt's token", url, good, other_token, "application/json"),
        ("a person's token", url, good, person, "application/json"),
        ("a forged mac", url, good, token[:-4] + "0000", "application/json"),
        ("malformed json", url, b'{"points": [', token, "application/json"),
        ("not an object", url, [1, 2], token, "application/json"),
        ("NaN", url, b'{"points": [{"rank": 0, "name": "loss", "step": 1, "value": NaN}]}',
         token, "application/json"),
        ("a NUL in a name", url, batch((0, "lo\u0000ss", 1, 1.0)), token, "application/json"),
        ("a bad point", url, batch((0, "loss", -1, 1.0)), token, "application/json"),
        ("a value past a double", url, b'{"points": [{"rank": 0, "name": "l", "step": 1, '
         b'"value": 1e999}]}', token, "application/json"),
        ("an unknown field", url, {**good, "extra": 1}, token, "application/json"),
        ("another job's id", url, {**good, "job_id": attempt.job_id + 1000}, token,
         "application/json"),
        ("points not a list", url, {"points": {"a": 1}}, token, "application/json"),
        ("a long batch id", url, {**good, "batch_id": "x" * 101}, token, "application/json"),
        ("too many points", url, batch(*[(0, "loss", s, 1.0) for s in range(5001)]), token,
         "application/json"),
        ("form data", url, b"points=1", token, "application/x-www-form-urlencoded"),
        ("utf-16", url, json.dumps(good).encode("utf-16"), token, "application/json"),
        ("a heartbeat without a rank", beat_url(attempt), {"step": 1}, token,
         "application/json"),
        ("a heartbeat with a negative rate", beat_url(attempt), beat(tokens_per_s=-1.0), token,
         "application/json"),
        ("a heartbeat with a gpu reading nested too deep", beat_url(attempt),
         beat(gpu=_nested(40)), token, "application/json"),
        ("a heartbeat with a bool step", beat_url(attempt), beat(step=True), token,
         "application/json"),
        ("a heartbeat to another attempt", beat_url(other), beat(), token, "application/json"),
    ]


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


class TestEverythingElseIsTheFullStacks:
    def test_each_bad_request_gets_the_full_stacks_answer_and_writes_nothing(
        self, attempt, reporting_job, owner
    ):
        attempt, token = attempt
        other, other_token = make_attempt(reporting_job)
        _, person = ApiToken.issue(owner, "fast-path")
        for name, path, body, credential, content_type in _bad_metrics(
                attempt, other, token, other_token, person):
            full = Recorder()
            fast = call(WorkerFastPath(full), path, body, credential, content_type=content_type)
            alone = call(django_application, path, body, credential, content_type=content_type)
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            assert full.bodies == [raw], name
            assert fast == alone, name
            assert fast[0] in (400, 401, 403, 413, 415), (name, fast)
        assert not MetricPoint.objects.exists()
        assert not RankStatus.objects.exists()

    def test_an_ended_attempt_is_told_to_stop_by_the_full_stack(self, reporting_job):
        attempt, token = make_attempt(reporting_job, state=JobAttempt.State.FAILED)
        full = Recorder()
        status, reply = call(WorkerFastPath(full), beat_url(attempt), beat(), token)
        assert len(full.bodies) == 1
        assert status == 403 and reply["stop"] is True

    @pytest.mark.django_db(transaction=True)
    def test_a_deleted_attempts_batch_is_refused_by_the_full_stack(self, reporting_job):
        # Committed rows: the foreign key is checked at commit.
        attempt, token = make_attempt(reporting_job)
        url = metrics_url(attempt)
        attempt.delete()
        full = Recorder()
        status, _ = call(WorkerFastPath(full), url, batch((0, "loss", 1, 1.0)), token)
        assert status == 401 and len(full.bodies) == 1

    def test_a_body_past_the_limit_is_not_read(self, attempt, settings):
        attempt, token = attempt
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64
        full = Recorder()
        status, _ = call(WorkerFastPath(full), metrics_url(attempt),
                         batch(*[(0, "loss", s, 1.0) for s in range(10)]), token)
        assert status == 413 and len(full.bodies) == 1

    def test_a_host_not_allowed_is_refused_by_the_full_stack(self, attempt):
        attempt, token = attempt
        full = Recorder()
        status, _ = call(WorkerFastPath(full), metrics_url(attempt), batch((0, "loss", 1, 1.0)),
                         token, host="evil.example")
        assert status == 400 and len(full.bodies) == 1
        assert not MetricPoint.objects.exists()

    def test_other_paths_and_methods_pass_straight_through(self, attempt):
        attempt, token = attempt
        full = Recorder()
        status, _ = call(WorkerFastPath(full), metrics_url(attempt) + "/", batch(), token)
        assert len(full.bodies) == 1 and status == 404


class _Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def process_request_thread(self, request, client_address):
        # Each request's thread closes its own database connection, as
        # Django's live server does, so the test database can be dropped.
        try:
            super().process_request_thread(request, client_address)
        finally:
            connections.close_all()


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_the_trainers_reporter_over_http_through_the_served_application(team, cluster, owner):
    """The SDK's reporting thread against `controlplane.wsgi.application`
    served over real HTTP (the live_server fixture serves Django's handler,
    below the fast path)."""
    job = make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt")
    attempt, token = make_attempt(job)
    request_id = attempt.request_checkpoint("user:olivia")
    server = make_server("127.0.0.1", 0, application, server_class=_Threading,
                         handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    reporter = Reporter(f"http://127.0.0.1:{server.server_port}", token, str(attempt.pk),
                        rank=0, node="cpu-a-0", heartbeat_interval_s=0.2)
    reporter.start()
    try:
        reporter.update_status(step=3, samples_per_s=10.0, tokens_per_s=640.0, step_time_s=0.1)
        for step in range(1, 201):
            reporter.metric("loss", step, 3.0 - step / 100)
        eventually(lambda: (MetricPoint.objects.filter(attempt=attempt).count() == 200
                            and JobAttempt.objects.get(pk=attempt.pk).last_step == 3
                            and reporter.directives().get("checkpoint_request") == request_id),
                   timeout=20, interval=0.1, what="the points, the status and the directive")
    finally:
        reporter.close()
        server.shutdown()
        server.server_close()
    assert MetricPoint.objects.filter(attempt=attempt).count() == 200
    assert reporter.directives().get("checkpoint_request") == request_id
    assert JobAttempt.objects.get(pk=attempt.pk).last_step == 3
