"""The trainer's own reporting thread against the API over real HTTP: the
contract of docs/trainer-protocol.md seen from both sides at once."""

import pytest
from regatta.reporting import Reporter

from checkpoints.models import Checkpoint
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, JobEvent, RankStatus
from tests.api_factories import make_attempt, make_job
from tests.support.waiting import eventually


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_the_trainers_reporter_delivers_everything_and_gets_directives(
    live_server, team, cluster, owner
):
    job = make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt")
    attempt, token = make_attempt(job)
    request_id = attempt.request_checkpoint("user:olivia")
    reporter = Reporter(live_server.url, token, str(attempt.pk), rank=0, node="cpu-a-0",
                        heartbeat_interval_s=0.2)
    reporter.start()
    try:
        reporter.update_status(step=3, samples_per_s=10.0, tokens_per_s=640.0, step_time_s=0.1)
        for step in (1, 2, 3):
            reporter.metric("loss", step, 3.0 - step / 10)
        reporter.event("started", "fresh start", {"params": 1000})
        reporter.checkpoint({"step": 3, "uri": "file:///tmp/ckpt/step-3", "bytes": 10,
                             "manifest_sha256": "ab" * 32, "save_seconds": 0.1,
                             "blocking_seconds": 0.01, "emergency": False,
                             "request_id": request_id})
        eventually(lambda: reporter.directives().get("checkpoint_request") == request_id,
                   timeout=20, what="the checkpoint request")
        eventually(lambda: MetricPoint.objects.filter(attempt=attempt).count() == 3,
                   timeout=20, what="the 3 points")
        eventually(lambda: Checkpoint.objects.filter(job=job, step=3).exists(),
                   timeout=20, what="the step-3 checkpoint")
        eventually(lambda: JobAttempt.objects.get(pk=attempt.pk).last_step == 3,
                   timeout=20, what="last_step 3")
    finally:
        reporter.close()
    assert RankStatus.objects.get(attempt=attempt).node_name == "cpu-a-0"
    job.refresh_from_db()
    assert job.current_step == 3 and job.progress["tokens_per_s"] == 640.0
    assert JobEvent.objects.filter(job=job, kind="TrainerStarted",
                                   actor="worker:rank0@cpu-a-0").exists()
    assert not any(key.endswith("_refused") for key in reporter.sent)


class ReplyLosingProxy:
    """A real HTTP hop in front of the live server that forwards every
    request but drops the reply of the first `lose` event posts, as a
    timed-out or cut connection does: the server stored the event, the rank
    never heard so."""

    def __init__(self, upstream: str, lose: int):
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        target = urlsplit(upstream).netloc
        proxy = self
        self.lost = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                conn = http.client.HTTPConnection(target, timeout=10)
                conn.request("POST", self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if self.path.endswith("/events") and proxy.lost < lose:
                    proxy.lost += 1
                    self.close_connection = True
                    return  # no reply at all
                self.send_response(resp.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.timeout(60)
@pytest.mark.django_db(transaction=True)
def test_an_event_whose_reply_was_lost_is_stored_once(live_server, team, cluster, owner):
    job = make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt")
    attempt, token = make_attempt(job)
    proxy = ReplyLosingProxy(live_server.url, lose=3)
    reporter = Reporter(proxy.url, token, str(attempt.pk), rank=0, node="cpu-a-0",
                        heartbeat_interval_s=0.2, job_id=str(job.pk))
    reporter.start()
    try:
        reporter.event("started", "fresh start", {"world_size": 1})
        reporter.event("finished", "finished at step 3", {"step": 3})
        eventually(lambda: reporter.pending() == 0 and proxy.lost == 3,
                   timeout=20, what="everything sent, 3 replies lost")
    finally:
        reporter.close()
        proxy.close()

    kinds = list(JobEvent.objects.filter(job=job, kind__startswith="Trainer")
                 .order_by("id").values_list("kind", flat=True))
    assert kinds == ["TrainerStarted", "TrainerFinished"]
    assert reporter.sent["events"] == 2
