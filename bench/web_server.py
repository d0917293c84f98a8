"""The web server under the ranks' traffic: granian (what Regatta ships)
beside gunicorn with threads (what it shipped before), in the same run.

Both serve the same `controlplane.wsgi:application` with 4 workers of 4
threads, on loopback, against one fresh PostgreSQL database (gunicorn
stays installed beside granian: the same WSGI app runs under either).

Load: the load tool of bench/ingest.py (20 clients, one keep-alive
connection and one attempt each, batches of --batch points back to back),
--seconds a phase, the two servers interleaved over --rounds. Printed per
server: requests/s, p50/p99, and CPU milliseconds a request of the server's
processes, of PostgreSQL's and of the load tool, then granian over gunicorn.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x REDIS_URL=redis://127.0.0.1:6379/9 \\
        .venv/bin/python bench/web_server.py [--seconds 8] [--rounds 3] [--batch 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ingest as load  # noqa: E402  (bench/ingest.py: its load tool and set-up)

ROOT = load.ROOT
def command(server: str, port: int) -> tuple[list, dict]:
    if server == "granian":
        return ([sys.executable, "-m", "granian", *load.WEB_SERVER, "--host", "127.0.0.1",
                 "--port", str(port), "--log-level", "warning",
                 "controlplane.wsgi:application"], {})
    return ([sys.executable, "-m", "gunicorn", "controlplane.wsgi:application", "--bind",
             f"127.0.0.1:{port}", "--workers", "4", "--threads", "4", "--log-level", "warning"],
            {})


def cpu_of(procs) -> float:
    """User and system CPU seconds of these processes (one that ended counts 0)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_cpu(pid: int) -> float:
    try:
        return cpu_of([psutil.Process(pid), *psutil.Process(pid).children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0.0


def postgres_cpu() -> float:
    return cpu_of(p for p in psutil.process_iter(["name"])
                  if (p.info["name"] or "").startswith("postgres"))


def own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def measure(server: str, env: dict, port: int, target: load.Target, args) -> dict:
    argv, extra = command(server, port)
    workdir = Path(env["REGATTA_STATE_DIR"])
    proc = subprocess.Popen(argv, cwd=ROOT, env={**env, **extra},
                            stdout=open(workdir / f"{server}.log", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        load.wait_until_up(f"http://127.0.0.1:{port}/", proc)
        load.drive(target, args.batch, 2)  # warm: connections, imports, plans
        before = (tree_cpu(proc.pid), postgres_cpu(), own_cpu())
        phase = load.drive(target, args.batch, args.seconds)
        after = (tree_cpu(proc.pid), postgres_cpu(), own_cpu())
    finally:
        load.stop(proc)
    per = [(b - a) * 1000 / max(phase.requests, 1) for a, b in zip(before, after, strict=True)]
    return {"phase": phase, "server": per[0], "postgres": per[1], "tool": per[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--port", type=int, default=18720)
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        raise SystemExit("DATABASE_URL must name a PostgreSQL server")
    workdir = ROOT / ".regatta" / "bench-web-server"
    workdir.mkdir(parents=True, exist_ok=True)
    db = load.fresh_database(base, "regatta_bench_web")
    env = load.migrated_regatta(db, workdir)
    attempts, _ = load.regatta_rows()
    target = load.regatta_target(args.port, attempts)
    print(f"{load.CLIENTS} clients, batches of {args.batch}, {args.seconds:.0f} s a phase, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}", flush=True)
    results: dict = {"gunicorn": [], "granian": []}
    for rnd in range(args.rounds):
        order = ("gunicorn", "granian") if rnd % 2 == 0 else ("granian", "gunicorn")
        for server in order:
            out = measure(server, env, args.port, target, args)
            results[server].append(out)
            p = out["phase"]
            print(f"round {rnd + 1} {server:<8} {p.requests / p.seconds:>6.0f} req/s, errors "
                  f"{p.errors}", flush=True)
    print(f"\n{'server':<22} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'CPU ms/request: server':>23} {'PostgreSQL':>10} {'load tool':>9}")
    summary = {}
    for server, label in (("gunicorn", "gunicorn 4x4 (before)"), ("granian", "granian 4x4")):
        runs = results[server]
        phase = load.merge([r["phase"] for r in runs])
        cpu = {k: sum(r[k] for r in runs) / len(runs) for k in ("server", "postgres", "tool")}
        summary[server] = (phase.requests / phase.seconds, load.pct(phase.latencies, .5),
                           load.pct(phase.latencies, .99))
        print(f"{label:<22} {summary[server][0]:>7.0f} {summary[server][1]:>7.1f} "
              f"{summary[server][2]:>7.1f} {cpu['server']:>23.2f} {cpu['postgres']:>10.2f} "
              f"{cpu['tool']:>9.2f}   errors {phase.errors}")
    g, u = summary["granian"], summary["gunicorn"]
    print(f"{'granian / gunicorn':<22} {g[0] / u[0]:>6.2f}x {u[1] / g[1]:>6.2f}x "
          f"{u[2] / g[2]:>6.2f}x  (req/s; latency gunicorn/granian)")


if __name__ == "__main__":
    main()
