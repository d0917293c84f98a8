"""Metric ingestion: Regatta's worker `metrics` endpoint beside an MLflow
tracking server's `log-batch`, on the same machine and PostgreSQL, driven by
the same load tool in the same run (issue 17).

Starts both servers itself, on loopback: Regatta under granian with 4
workers (4 threads each, as the Dockerfile runs it) and `mlflow server` with
4 workers, each on a fresh database of its own on the PostgreSQL that
DATABASE_URL names. MLflow is a bench-only tool: it is installed into its
own virtualenv (.bench-venv/mlflow, created on first use), never into
Regatta's. The index reachable here has no mlflow 3.18.0 (its
mlflow-skinny is missing), so the newest it has, 3.17.2, is used; the issue
measured 3.17.

Load: 20 client threads, each with its own keep-alive connection
(`http.client`, each body built once and encoded by msgspec: the tool's
own CPU is taken from the same two cores the servers run on; `requests`
cost 2 ms of it a request, as much as the server, and Python's json 2 ms
of a 500-point batch's 3) and its own run (MLflow) or attempt
(Regatta), send batches of 10 and of 500 points
back to back for --seconds per phase; phases are interleaved (MLflow and
Regatta alternate which goes first) and repeated --rounds times. Prints
points/s and p50/p99 latency per target and batch size, and Regatta over
MLflow as a ratio. Every 25th Regatta batch is sent twice (a retry): the
bench checks that the points stored equal the distinct points acknowledged.

Then 2,000 simulated ranks (20 attempts of 100 ranks) beat every 5 s for
--beat-seconds, and the heartbeat p50/p99 is printed beside the batch-of-10
metrics latency measured above. Usage:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/regatta REDIS_URL=redis://127.0.0.1:6379/7 \\
        .venv/bin/python bench/ingest.py [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import msgspec
import psycopg
import requests

from jobs.worker_api.tokens import issue as issue_token

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_VENV = ROOT / ".bench-venv" / "mlflow"
MLFLOW_VERSION = "3.17.2"
CLIENTS = 20
RETRY_EVERY = 25
RANKS, RANKS_PER_ATTEMPT, BEAT_EVERY_S = 2000, 100, 5.0
BEAT_THREADS = 40
NAMES = ("loss", "lr")
# As the Dockerfile runs the web.
WEB_SERVER = ("--interface", "wsgi", "--no-ws", "--workers", "4", "--blocking-threads", "4")


def database_url(base: str, name: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def fresh_database(base: str, name: str) -> str:
    with psycopg.connect(database_url(base, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(base, name)


def count_rows(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before answering {url}")
        try:
            if requests.get(url, timeout=2).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"no answer from {url} in {timeout:.0f} s")


# --- servers ---------------------------------------------------------------

def mlflow_bin() -> Path:
    exe = MLFLOW_VENV / "bin" / "mlflow"
    if not exe.exists():
        print(f"installing mlflow=={MLFLOW_VERSION} into {MLFLOW_VENV} (bench only)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MLFLOW_VENV)], check=True)
        subprocess.run([str(MLFLOW_VENV / "bin" / "pip"), "install", "--quiet",
                        f"mlflow=={MLFLOW_VERSION}", "psycopg2-binary"], check=True)
    return exe


def start_mlflow(db_url: str, port: int, workdir: Path) -> subprocess.Popen:
    store = db_url.replace("postgres://", "postgresql+psycopg2://", 1)
    proc = subprocess.Popen(
        [str(mlflow_bin()), "server", "--backend-store-uri", store,
         "--default-artifact-root", str(workdir / "mlflow-artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "4",
         # Uvicorn kills a worker that misses a 5 s health check, which a busy
         # 2-core machine makes happen mid-run: give MLflow every chance.
         "--uvicorn-opts", "--timeout-worker-healthcheck 120"],
        stdout=open(workdir / "mlflow.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    wait_until_up(f"http://127.0.0.1:{port}/health", proc)
    return proc


def start_regatta(env: dict, port: int, workdir: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "granian", *WEB_SERVER, "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "controlplane.wsgi:application"],
        cwd=ROOT, env=env, stdout=open(workdir / "regatta.log", "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    wait_until_up(f"http://127.0.0.1:{port}/", proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, 9)


# --- the load tool -------------------------------------------------------------

@dataclass
class Phase:
    latencies: list = field(default_factory=list)
    points: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0


@dataclass
class Target:
    """How one server takes a batch: where to post it and what body."""

    name: str
    port: int
    clients: list  # per client: (path, headers, id)
    body: object  # (client id, step, batch) -> json body
    ok: object  # (status, reply bytes, batch) -> bool
    retries: bool = False
    steps: list = field(default_factory=lambda: [0] * CLIENTS)


class Http:
    """One keep-alive connection to a server on loopback, opened again after
    an error or a `Connection: close`."""

    def __init__(self, port: int):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path: str, body: dict, headers: dict) -> tuple[int, bytes]:
        data = msgspec.json.encode(body)
        try:
            self.conn.request("POST", path, data, {**headers, "Content-Type": "application/json"})
            resp = self.conn.getresponse()
            reply = resp.status, resp.read()
            if resp.will_close:
                self._reopen()
            return reply
        except (http.client.HTTPException, OSError):  # a server worker died: an error
            self._reopen()
            return 0, b""

    def _reopen(self) -> None:
        self.conn.close()
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)


def _client(target: Target, index: int, batch: int, until: float, phase: Phase,
            lock: threading.Lock) -> None:
    path, headers, ident = target.clients[index]
    client = Http(target.port)
    sent = 0
    while time.monotonic() < until:
        step = target.steps[index]
        target.steps[index] += batch // len(NAMES)
        body = target.body(ident, step, batch)
        copies = 2 if target.retries and sent % RETRY_EVERY == RETRY_EVERY - 1 else 1
        good = True
        for _ in range(copies):
            start = time.perf_counter()
            status, reply = client.post(path, body, headers)
            good = good and target.ok(status, reply, batch)
            took = time.perf_counter() - start
            with lock:
                phase.latencies.append(took)
                phase.requests += 1
        sent += 1
        with lock:
            phase.points += batch if good else 0
            phase.errors += 0 if good else 1


def drive(target: Target, batch: int, seconds: float) -> Phase:
    phase, lock = Phase(), threading.Lock()
    until = time.monotonic() + seconds
    start = time.perf_counter()
    threads = [threading.Thread(target=_client, args=(target, i, batch, until, phase, lock))
               for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase.seconds = time.perf_counter() - start
    return phase


def pct(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


# --- the two targets -------------------------------------------------------------

def points(step: int, batch: int) -> list[tuple[str, int, float]]:
    return [(NAMES[i % len(NAMES)], step + i // len(NAMES), 1.0 / (1 + step + i))
            for i in range(batch)]


def regatta_target(port: int, attempts: list) -> Target:
    def body(attempt_id, step, batch):
        return {"batch_id": f"a{attempt_id}-{step}", "points": [
            {"rank": 0, "name": n, "step": s, "value": v} for n, s, v in points(step, batch)]}

    def ok(status, data, batch):
        if status != 200:
            return False
        reply = json.loads(data)
        return reply["stored"] + reply["duplicates"] == batch

    clients = [(f"/api/v1/worker/attempts/{a}/metrics", {"Authorization": f"Bearer {t}"}, a)
               for a, t in attempts]
    return Target("regatta", port, clients, body, ok, retries=True)


def _setup_post(url: str, body: dict) -> dict:
    """A set-up call, tried again while a just-started worker is not ready."""
    for _ in range(30):
        try:
            resp = requests.post(url, json=body, timeout=60)
            if resp.status_code == 200:
                return resp.json()
        except requests.RequestException:
            pass
        time.sleep(1)
    raise SystemExit(f"set-up call {url} kept failing")


def mlflow_target(port: int) -> Target:
    url = f"http://127.0.0.1:{port}"
    experiment = _setup_post(f"{url}/api/2.0/mlflow/experiments/create",
                             {"name": f"bench-{secrets.token_hex(4)}"})
    clients = []
    for _ in range(CLIENTS):
        run = _setup_post(f"{url}/api/2.0/mlflow/runs/create", {
            "experiment_id": experiment["experiment_id"],
            "start_time": int(time.time() * 1000)})
        clients.append(("/api/2.0/mlflow/runs/log-batch", {}, run["run"]["info"]["run_id"]))

    def body(run_id, step, batch):
        now = int(time.time() * 1000)
        return {"run_id": run_id, "metrics": [
            {"key": n, "value": v, "timestamp": now, "step": s} for n, s, v in points(step, batch)]}

    return Target("mlflow", port, clients, body, lambda status, data, batch: status == 200)


# --- Regatta's rows -------------------------------------------------------------

def migrated_regatta(db_url: str, workdir: Path) -> dict:
    """Django set up in this process on `db_url`, migrated; the environment
    a Regatta server started by the bench runs with."""
    env = {**os.environ, "DATABASE_URL": db_url, "DEBUG": "0",
           "SECRET_KEY": secrets.token_urlsafe(40), "REGATTA_STATE_DIR": str(workdir)}
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return env


def regatta_rows() -> tuple[list, list]:
    """Attempts for the metric clients and for the simulated ranks, with tokens."""
    from clusters.models import Cluster
    from jobs.models import JobAttempt, Team, TrainingJob

    cluster = Cluster.objects.create(name="bench", provider="local")
    team = Team.objects.create(name="bench")

    def attempt(name: str):
        job = TrainingJob.objects.create(name=name, team=team, cluster=cluster, num_nodes=1,
                                         gpus_per_node=8, phase="running")
        row = JobAttempt.objects.create(job=job, number=1, state="running")
        return row.pk, issue_token(row)

    metric = [attempt(f"metrics-{i}") for i in range(CLIENTS)]
    beats = [attempt(f"ranks-{i}") for i in range(RANKS // RANKS_PER_ATTEMPT)]
    return metric, beats


# --- 2,000 ranks beating --------------------------------------------------------

def _ranks(thread: int, beats: list) -> list:
    """This thread's ranks as (attempt id, token, rank), every BEAT_THREADS-th."""
    ranks = [(a, t, r) for a, t in beats for r in range(RANKS_PER_ATTEMPT)]
    return ranks[thread::BEAT_THREADS]


def _beater(port: int, mine: list, start: float, until: float, phase: Phase,
            lock: threading.Lock) -> None:
    """Each rank beats every BEAT_EVERY_S, the ranks spread over the period;
    a beat that is due goes out at once, so a slow server shows as latency."""
    client = Http(port)
    due = [start + BEAT_EVERY_S * i / len(mine) for i in range(len(mine))]
    steps = [0] * len(mine)
    while True:
        i = min(range(len(mine)), key=due.__getitem__)
        if due[i] >= until:
            return
        time.sleep(max(0.0, due[i] - time.monotonic()))
        attempt_id, token, rank = mine[i]
        steps[i] += 10
        body = {"rank": rank, "node": f"node-{rank // 8}", "step": steps[i],
                "samples_per_s": 64.0, "tokens_per_s": 8192.0, "step_time_s": 0.2, "gpu": None}
        began = time.perf_counter()
        status, _ = client.post(f"/api/v1/worker/attempts/{attempt_id}/heartbeat", body,
                                {"Authorization": f"Bearer {token}"})
        good = status == 200
        took = time.perf_counter() - began
        with lock:
            phase.latencies.append(took)
            phase.requests += 1
            phase.errors += not good
        due[i] += BEAT_EVERY_S


def heartbeats(port: int, beats: list, seconds: float) -> Phase:
    phase, lock = Phase(), threading.Lock()
    start = time.monotonic() + 0.5
    until = start + seconds
    threads = [threading.Thread(target=_beater, args=(port, _ranks(i, beats), start, until,
                                                      phase, lock))
               for i in range(BEAT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase.seconds = seconds
    return phase


# --- the run ------------------------------------------------------------------

def merge(phases: list[Phase]) -> Phase:
    out = Phase()
    for p in phases:
        out.latencies += p.latencies
        out.points += p.points
        out.requests += p.requests
        out.errors += p.errors
        out.seconds += p.seconds
    return out


def _row(batch: int, name: str, p: Phase) -> str:
    return (f"{batch:>6} {name:<8} {p.points / p.seconds:>10,.0f} {p.requests / p.seconds:>8,.0f}"
            f" {pct(p.latencies, .5):>8.1f} {pct(p.latencies, .99):>8.1f} {p.errors:>7}")


def _ratio(batch: int, m: Phase, r: Phase) -> str:
    speed = (r.points / r.seconds) / (m.points / m.seconds)
    p50 = pct(m.latencies, .5) / max(pct(r.latencies, .5), 1e-9)
    p99 = pct(m.latencies, .99) / max(pct(r.latencies, .99), 1e-9)
    return (f"{batch:>6} {'ratio':<8} {speed:>9.1f}x {'':>8} {p50:>7.1f}x {p99:>7.1f}x"
            "  (points/s Regatta/MLflow; latency MLflow/Regatta)")


def report(results: dict, batches: list[int], beat: Phase, stored: dict) -> None:
    print(f"\n{'batch':>6} {'target':<8} {'points/s':>10} {'req/s':>8} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'errors':>7}")
    for batch in batches:
        for name in ("mlflow", "regatta"):
            print(_row(batch, name, results[(name, batch)]))
        print(_ratio(batch, results[("mlflow", batch)], results[("regatta", batch)]))
    small = results[("regatta", batches[0])]
    print(f"\nheartbeats: {RANKS} ranks every {BEAT_EVERY_S:.0f} s: "
          f"{beat.requests / beat.seconds:,.0f} beats/s (offered {RANKS / BEAT_EVERY_S:,.0f}), "
          f"p50 {pct(beat.latencies, .5):.1f} ms, p99 {pct(beat.latencies, .99):.1f} ms, "
          f"errors {beat.errors}")
    print(f"  beside Regatta metrics, batch {batches[0]}: p50 {pct(small.latencies, .5):.1f} ms, "
          f"p99 {pct(small.latencies, .99):.1f} ms")
    verdict = "OK" if stored["regatta"] == stored["acked"] else "MISMATCH"
    print(f"exactly once: Regatta stored {stored['regatta']:,} points, acknowledged "
          f"{stored['acked']:,} distinct ({verdict}, with every {RETRY_EVERY}th batch sent "
          f"twice); MLflow stored {stored['mlflow']:,}, acknowledged {stored['mlflow_acked']:,}")


def run(args, regatta: Target, mlflow: Target, beats: list, port: int) -> None:
    # Warm both (connections, imports, query plans); their points count as acknowledged.
    warm = {t.name: drive(t, args.batches[0], 2).points for t in (mlflow, regatta)}
    results: dict = {}
    for rnd in range(args.rounds):
        for batch in args.batches:
            order = (mlflow, regatta) if rnd % 2 == 0 else (regatta, mlflow)
            for target in order:
                phase = drive(target, batch, args.seconds)
                results.setdefault((target.name, batch), []).append(phase)
                print(f"round {rnd + 1} batch {batch:>4} {target.name:<8} "
                      f"{phase.points / phase.seconds:>9,.0f} points/s", flush=True)
    merged = {key: merge(phases) for key, phases in results.items()}
    beat = heartbeats(port, beats, args.beat_seconds)

    def acked(name):
        return warm[name] + sum(p.points for (n, _), p in merged.items() if n == name)

    stored = {"regatta": count_rows(args.regatta_db, "jobs_metricpoint"),
              "acked": acked("regatta"), "mlflow": count_rows(args.mlflow_db, "metrics"),
              "mlflow_acked": acked("mlflow")}
    report(merged, args.batches, beat, stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--beat-seconds", type=float, default=15.0)
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")],
                        default=[10, 500])
    parser.add_argument("--port", type=int, default=18700)
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        raise SystemExit("DATABASE_URL must name a PostgreSQL server (both servers use it)")
    workdir = ROOT / ".regatta" / "bench-ingest"
    workdir.mkdir(parents=True, exist_ok=True)
    args.regatta_db = fresh_database(base, "regatta_bench_ingest")
    args.mlflow_db = fresh_database(base, "mlflow_bench_ingest")
    env = migrated_regatta(args.regatta_db, workdir)
    metric_attempts, beats = regatta_rows()
    procs = []
    try:
        procs.append(start_mlflow(args.mlflow_db, args.port + 1, workdir))
        procs.append(start_regatta(env, args.port, workdir))
        mlflow = mlflow_target(args.port + 1)
        regatta = regatta_target(args.port, metric_attempts)
        print(f"servers up: regatta :{args.port} (granian 4x4), mlflow :{args.port + 1} "
              f"(4 workers); {CLIENTS} clients, {args.seconds:.0f} s a phase, "
              f"{args.rounds} rounds", flush=True)
        run(args, regatta, mlflow, beats, args.port)
    finally:
        for proc in procs:
            stop(proc)


if __name__ == "__main__":
    main()
