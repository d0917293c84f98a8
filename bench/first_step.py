"""The demo's first step after submit on an idle local fleet, beside a bare
torchrun start of the same trainer, in one run.

    .venv/bin/python bench/first_step.py            # 3 submits, 3 bare starts
    .venv/bin/python bench/first_step.py --runs 1 --cold-preflight

Regatta runs for real, as `./run` starts it (`manage.py regatta_up`: the
embedded broker, web, a Celery worker and beat, the local fleet of 4 nodes
and a spare), in a state folder of its own. Once the fleet is idle and warm
(a standby on every node), the demo job (the built-in GPT, 2 nodes × 1 rank,
the demo's hyperparameters) is submitted through the API; measured: submit
→ the attempt's first step (the heartbeat that carried it), with the steps
between (queued, admitted, preflight, launched) from the job's timeline.
The job is then cancelled and the fleet left to settle before the next.

The baseline: the same trainer under two bare `torchrun` processes
(--nnodes=2, one rank each, gloo on CPU, no control plane), from the spawn to
the first step it logs (`log_every_steps: 1`), before and after the
product's runs. `--cold-preflight` also times the allreduce preflight on
two nodes without standbys (two cold Python starts per node) and with them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DEMO_HYPERPARAMETERS = {"model": "tiny", "max_steps": 3000, "batch_size": 8,
                        "val_every_steps": 50, "log_every_steps": 5}
STEP_LINE = re.compile(rb"step 1 loss")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_torchrun(work: Path) -> float:
    """Seconds from spawning two torchrun processes to rank 0's first step,
    in a folder of its own (no checkpoint of an earlier start to resume)."""
    work.mkdir(parents=True)
    port = free_port()
    config = {**DEMO_HYPERPARAMETERS, "log_every_steps": 1, "checkpoint_every_steps": 100}
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
    env.update(OMP_NUM_THREADS="1", REGATTA_CONFIG=json.dumps(config),
               REGATTA_CHECKPOINT_URI=f"file://{work}/ckpt", PYTHONUNBUFFERED="1")
    logs = [work / f"bare-{i}.log" for i in range(2)]
    started = time.monotonic()
    procs = []
    for i, log in enumerate(logs):
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                 f"--node_rank={i}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                 f"--master_port={port}", "-m", "trainer"],
                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True))
    try:
        while time.monotonic() - started < 300:
            if any(STEP_LINE.search(log.read_bytes()) for log in logs if log.exists()):
                return time.monotonic() - started
            if all(p.poll() is not None for p in procs):
                raise RuntimeError("bare torchrun ended before its first step: "
                                   + logs[0].read_text()[-2000:])
            time.sleep(0.05)
        raise RuntimeError("bare torchrun: no first step in 300 s: "
                           + "\n".join(log.read_text()[-1500:] for log in logs))
    finally:
        # torchrun starts each rank in a session of its own: killing its
        # process group alone would leave the ranks training on.
        ranks = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                ranks += psutil.Process(p.pid).children(recursive=True)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        psutil.wait_procs(ranks, timeout=10)


class Product:
    """`regatta_up` in a state folder of its own, driven through its API and
    read through its database."""

    def __init__(self, state: Path):
        self.state = state
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update(REGATTA_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
        self.proc: subprocess.Popen | None = None

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env,
                              check=True, capture_output=True, text=True, timeout=300).stdout

    def start(self) -> None:
        self.manage("migrate", "--noinput", "-v0")
        self.manage("regatta_demo", "--no-job")
        self.token = (self.state / "demo-token").read_text().strip()
        self.console = open(self.state / "console.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "regatta_up", "--bind", f"127.0.0.1:{self.port}"],
            cwd=ROOT, env=self.env, stdout=self.console, stderr=subprocess.STDOUT)
        self.wait_for(lambda: b"Regatta is up" in (self.state / "console.log").read_bytes(),
                      120, "the web")

    def wait_for(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"regatta_up exited: {(self.state / 'console.log').read_text()}")
            if check():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}")

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"{self.url}/api/v1/{path}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def standbys_ready(self, nodes: list[str]) -> bool:
        root = self.state / "fleet" / "local" / "standby"
        for node in nodes:
            try:
                info = json.loads((root / node / "standby.json").read_text())
            except (OSError, ValueError):
                return False
            if info.get("state") != "ready":
                return False
        return True

    def idle(self) -> list[str]:
        nodes = self.api("GET", "nodes/?limit=100")
        rows = nodes.get("results", nodes)
        ready = [n["name"] for n in rows if n["state"] == "ready" and not n.get("is_spare")]
        jobs = self.api("GET", "jobs/?limit=100")
        live = [j for j in jobs.get("results", jobs)
                if j["phase"] not in ("succeeded", "failed", "cancelled")]
        return ready if not live else []

    def first_step(self, run: int) -> dict:
        self.wait_for(lambda: len(self.idle()) >= 2 and self.standbys_ready(self.idle()), 300,
                      "an idle fleet with warm standbys")
        time.sleep(2.0)  # the standbys' successors settle
        submitted = time.time()
        job = self.api("POST", "jobs/", {
            "name": f"first-step-{run}", "team": "demo", "cluster": "local", "num_nodes": 2,
            "gpus_per_node": 1, "hyperparameters": DEMO_HYPERPARAMETERS,
            "checkpoint_every_steps": 100})
        self.wait_for(lambda: bool(self.attempt(job["id"]).get("first_step_at")), 300,
                      f"job {job['id']}'s first step")
        timeline = self.timeline(job["id"], submitted)
        self.api("POST", f"jobs/{job['id']}/cancel/", {})
        self.wait_for(lambda: self.api("GET", f"jobs/{job['id']}/")["phase"] == "cancelled",
                      120, "the cancel")
        return timeline

    def attempt(self, job_id: int) -> dict:
        rows = self.api("GET", f"jobs/{job_id}/attempts/")
        rows = rows.get("results", rows)
        return rows[0] if rows else {}

    def timeline(self, job_id: int, submitted: float) -> dict:
        from datetime import datetime

        def at(text: str) -> float:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() - submitted

        events = self.api("GET", f"jobs/{job_id}/events/?limit=200")
        events = events.get("results", events)
        out = {}
        for e in events:
            out.setdefault(e["kind"], at(e["created_at"]))
        attempt = self.attempt(job_id)
        out["first step"] = at(attempt["first_step_at"])
        preflight = attempt.get("preflight") or {}
        out["preflight s"] = preflight.get("seconds")
        out["preflight warm"] = len(preflight.get("warm_nodes") or [])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def preflight_cost(state: Path) -> dict:
    """The local provider's allreduce preflight on two nodes, cold (no
    standbys) and in standbys."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["REGATTA_STATE_DIR"] = str(state / "preflight")
    import django

    django.setup()
    from regatta.node import procs, standby

    from clusters.providers.base import Placement, PoolInfo
    from clusters.providers.local import LocalProvider

    pool = PoolInfo(cluster="bench", name="cpu", instance_type="local-cpu", gpus_per_node=1,
                    size=2, spare_count=0)
    provider = LocalProvider("bench", state / "preflight-fleet", standbys=True)
    nodes = [n.name for n in provider.list_nodes(pool)][:2]
    placements = tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes))
    try:
        cold = provider.preflight(pool, placements, 120.0)
        provider.hold_spares(pool, nodes)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not all(
                json.loads((standby.standby_dir(provider.root, n) / standby.INFO).read_text()
                           if (standby.standby_dir(provider.root, n) / standby.INFO).exists()
                           else "{}").get("state") == "ready" for n in nodes):
            time.sleep(0.2)
        warm = provider.preflight(pool, placements, 120.0)
        return {"cold": cold.evidence["seconds"], "warm": warm.evidence["seconds"],
                "warm_nodes": len(warm.evidence.get("warm_nodes") or [])}
    finally:
        found = procs.scan(fleet=str(provider.root))
        procs.kill_hard(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold-preflight", action="store_true",
                        help="also time the preflight without and with standbys")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="regatta-first-step-") as tmp:
        work = Path(tmp)
        bare = [bare_torchrun(work / "bare-before")]
        product = Product(work / "state")
        runs = []
        try:
            product.start()
            for run in range(args.runs):
                runs.append(product.first_step(run))
                print(f"product run {run + 1}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in runs[-1].items()), flush=True)
        finally:
            product.stop()
        bare.append(bare_torchrun(work / "bare-after"))
        firsts = [r["first step"] for r in runs]
        med_product, med_bare = statistics.median(firsts), statistics.median(bare)
        print(f"\nsubmit → first step (product): median {med_product:.2f} s "
              f"({', '.join(f'{s:.2f}' for s in firsts)})")
        print(f"bare torchrun → first step:     median {med_bare:.2f} s "
              f"({', '.join(f'{s:.2f}' for s in bare)})")
        print(f"ratio product / bare:           {med_product / med_bare:.2f}")
        if args.cold_preflight:
            cost = preflight_cost(work)
            print(f"preflight on 2 cpu nodes: cold {cost['cold']:.2f} s, in standbys "
                  f"{cost['warm']:.2f} s ({cost['warm_nodes']} of 2 warm)")


if __name__ == "__main__":
    main()
