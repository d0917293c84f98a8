"""The run command on embedded defaults: the demo world, then web, worker,
beat and the embedded broker in the foreground; Ctrl-C leaves nothing behind."""

import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from django.core.management import call_command

from accounts.models import ApiToken
from clusters.models import Cluster
from jobs.models import Quota, Team, TrainingJob
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_world_is_created_once_however_often_it_runs(db):
    call_command("regatta_demo")
    call_command("regatta_demo")
    assert Cluster.objects.filter(name="local").count() == 1
    assert Cluster.objects.get(name="local").pools.get().spare_count == 1
    team = Team.objects.get(name="demo")
    assert Quota.objects.filter(team=team).count() == 1
    assert TrainingJob.objects.filter(team=team).count() == 1
    assert ApiToken.objects.filter(name="demo").count() == 1
    job = TrainingJob.objects.get(team=team)
    assert (job.num_nodes, job.phase) == (2, "pending")
    assert job.events.filter(kind="Submitted").exists()


def test_the_gpu_demo_gives_each_node_a_gpu_and_fits_the_job_to_a_pool_of_one(db):
    call_command("regatta_demo", "--devices", "cuda", "--nodes", "1", "--spares", "1")
    pool = Cluster.objects.get(name="local").pools.get()
    assert (pool.name, pool.instance_type, pool.config.devices) == ("gpu", "local-gpu", "cuda")
    job = TrainingJob.objects.get(team__name="demo")
    assert (job.pool, job.num_nodes, job.gpus_per_node) == (pool, 1, 1)


def test_the_default_demo_trains_on_cpu_whatever_gpus_the_machine_has(db):
    call_command("regatta_demo")
    assert Cluster.objects.get(name="local").pools.get(name="cpu").config.devices == "cpu"


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_the_demo_job_is_submitted_before_any_broker_runs(tmp_path):
    """`make run` creates the demo world, job included, before regatta_up
    starts the embedded broker: the submit must not need the broker (the
    sweep reconciles the job once the worker and beat are up)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(REGATTA_STATE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT,
                   env=env, check=True, timeout=120)
    assert not (tmp_path / "redis.sock").exists()
    demo = subprocess.run([sys.executable, "manage.py", "regatta_demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "demo job #1 submitted" in demo.stdout
    assert "Traceback" not in demo.stderr and "not sent" not in demo.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _login_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2) as r:
            return r.status
    except OSError:
        return None


def _sessions_alive(sids):
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, sid = fields[0], int(fields[3])
        if sid in sids and state != "Z":
            alive.append(int(entry.name))
    return alive


def _at_least_four_children(pid: int) -> list[int] | None:
    children = [int(p.name) for p in Path("/proc").iterdir()
                if p.name.isdigit() and _ppid(p) == pid]
    return children if len(children) >= 4 else None


def _ppid(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigint_to_the_one_pid_of_the_readme_run_command_stops_everything(tmp_path):
    """`./run` (the README's command) is one process: a supervisor's SIGINT to
    its PID stops web, worker, beat and broker. `make run` would not pass it on."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(REGATTA_STATE_DIR=str(tmp_path), PYTHONUNBUFFERED="1", DEMO_ARGS="--no-job")
    port = _free_port()
    up = subprocess.Popen([str(ROOT / "run"), "--bind", f"127.0.0.1:{port}"], cwd=tmp_path,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        def answers():
            assert up.poll() is None, "the run command exited before the web answered"
            return _login_status(port) == 200

        eventually(answers, timeout=180, interval=0.5, what="the web process to answer")
        children = eventually(lambda: _at_least_four_children(up.pid),
                              timeout=30, interval=0.2,
                              what="redis, web, worker and beat to be children of the PID")
        os.kill(up.pid, signal.SIGINT)  # the one PID, not its group
        output, _ = up.communicate(timeout=60)
        assert up.returncode == 0, output
        assert "stopped." in output
        eventually(lambda: _sessions_alive(set(children)) == [], timeout=0.5,
                   what="no process left in the children's sessions")
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_console_says_where_and_how_to_sign_in_and_job_changes_and_logs_the_rest(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(REGATTA_STATE_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT,
                   env=env, check=True, timeout=120)
    demo = subprocess.run([sys.executable, "manage.py", "regatta_demo"], cwd=ROOT, env=env,
                          check=True, timeout=60, capture_output=True, text=True)
    token = demo.stdout.split("demo API token: ", 1)[1].split()[0]
    port = _free_port()
    # A terminal, as a person has: Enter asks for the sign-in again.
    terminal, their_end = pty.openpty()
    up = subprocess.Popen(
        [sys.executable, "manage.py", "regatta_up", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdin=their_end, stdout=their_end, stderr=their_end,
    )
    os.close(their_end)
    chunks: list[bytes] = []

    def read():
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    def text() -> str:
        return b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")

    try:
        def says(what, times=1):
            def seen():
                assert up.poll() is None, text()
                return text().count(what) >= times
            return seen

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        eventually(says("Regatta is up"), timeout=120, what="the start-up block")
        eventually(says("job #1 demo-gpt-tiny: pending → queued"), timeout=60,
                   what="the demo job's first state change on the console")
        _login_status(port)  # one more access-log line
        os.write(terminal, b"\n")
        eventually(says("sign in:    admin / regatta-demo", times=2), timeout=30,
                   what="the sign-in printed again on Enter")
        children = eventually(lambda: _at_least_four_children(up.pid),
                              timeout=30, interval=0.2,
                              what="redis, web, worker and beat all to be running")
        # Ctrl-C: web, worker, beat and broker stop, and nothing is left.
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0, text()
        reader.join(timeout=5)
        eventually(lambda: _sessions_alive(set(children)) == [], timeout=0.5,
                   what="no process left in the children's sessions")
    finally:
        if up.poll() is None:
            up.kill()
        os.close(terminal)
    console = text()
    log = (tmp_path / "logs" / "regatta.log").read_text()
    assert f"open http://127.0.0.1:{port}/" in console
    assert "sign in:    admin / regatta-demo" in console
    assert f"API token:  {token}" in console
    assert "stopped." in console
    assert str(tmp_path / "logs" / "regatta.log") in console
    # Access and task logs, and Celery's banners, go to the log file only.
    for noise in ('"GET /login/', "celery beat v", "Task jobs.tasks", "Scheduler: Sending"):
        assert noise not in console, noise
    assert '"GET /login/' in log and "celery beat v" in log and "Task jobs.tasks" in log
    assert console.count(f"API token:  {token}") == 2
    assert len(console.splitlines()) < 50, console
