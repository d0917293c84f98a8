"""A web restart under a running job loses nothing a rank reported: the
real web server (granian, the production command) is killed and started
again while the SDK's reporter sends, and the rank ends while the web is
down. Its loss series is whole, its `started` and `finished` events are
stored once each, and no event is stored twice."""

import collections
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from regatta.reporting import Reporter
from regatta.spool import storage_handoff

from checkpoints.models import Checkpoint
from jobs.checkpointing import open_job_storage
from jobs.metrics.models import MetricPoint
from jobs.models import JobEvent
from jobs.worker_api.undelivered import collect
from tests.api_factories import make_attempt, make_job
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[3]
GRANIAN = Path(sys.executable).parent / "granian"  # this environment's
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


class Web:
    """The web process on the test database, started as production starts it."""

    def __init__(self, log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self.proc = log, None

    def start(self) -> None:
        env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
               "SECRET_KEY": settings.SECRET_KEY, "REGATTA_STATE_DIR": str(settings.STATE_DIR),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'worker_image'}"}
        self.proc = subprocess.Popen(
            [str(GRANIAN), "--interface", "wsgi", "--no-ws",
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "controlplane.wsgi:application"],
            cwd=ROOT, env=env, stdout=self.log.open("a"), stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            eventually(self.answers, timeout=60, interval=0.2, what="the web to start")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.log.read_text()[-3000:]}") from None

    def answers(self) -> bool:
        assert self.proc.poll() is None, "the web exited"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/login/")
            return conn.getresponse().status == 200
        except OSError:
            return False

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its workers, at once
        self.proc.wait()


def train(reporter, steps: range) -> None:
    for step in steps:
        reporter.update_status(step=step)
        reporter.metric("loss", step, 3.0 - step / 1000)
        time.sleep(0.005)  # a training loop's pace, not a wait


@pytest.mark.django_db(transaction=True)
def test_nothing_a_rank_reported_is_lost_to_a_web_restart(team, cluster, owner, tmp_path):
    storage = tmp_path / "ckpt"
    job = make_job(team, cluster, owner, phase="running", storage_uri=str(storage))
    attempt, token = make_attempt(job)
    web = Web(tmp_path / "web.log")
    web.start()
    reporter = Reporter(web.url, token, str(attempt.pk), rank=0, node="cpu-a-0",
                        heartbeat_interval_s=0.2, job_id=str(job.pk), max_metrics=50,
                        handoff=storage_handoff(str(storage)))
    reporter.start()
    try:
        reporter.event("started", "fresh start", {"world_size": 1})
        train(reporter, range(1, 101))
        web.kill()
        train(reporter, range(101, 201))
        reporter.checkpoint({"step": 200, "uri": f"file://{storage}/step-200", "bytes": 10,
                             "manifest_sha256": "ab" * 32, "save_seconds": 0.1,
                             "blocking_seconds": 0.01, "emergency": False, "request_id": ""})
        web.start()
        train(reporter, range(201, 251))
        eventually(lambda: not reporter.pending(), timeout=60, interval=0.1,
                   what="everything sent to the restarted web")
        assert MetricPoint.objects.filter(attempt=attempt).count() == 250
        web.kill()
        # The run ends while the web is down again.
        train(reporter, range(251, 301))
        reporter.event("finished", "finished at step 300", {"step": 300})
    finally:
        reporter.close(timeout_s=1.0)
        if web.proc.poll() is None:
            web.kill()
    assert reporter.handed_off_to and not reporter.dropped

    # What the reconciler does once it sees the attempt ended.
    collect(attempt, open_job_storage(job))

    steps = list(MetricPoint.objects.filter(attempt=attempt, name="loss")
                 .order_by("step").values_list("step", flat=True))
    assert steps == list(range(1, 301))
    trainer = collections.Counter(JobEvent.objects.filter(job=job, kind__startswith="Trainer")
                                  .values_list("kind", flat=True))
    assert trainer == {"TrainerStarted": 1, "TrainerFinished": 1}
    keys = [k for k in JobEvent.objects.filter(job=job).values_list("key", flat=True) if k]
    assert len(keys) == len(set(keys)) == 3  # started, finished, the collection
    assert Checkpoint.objects.filter(job=job, step=200).count() == 1
