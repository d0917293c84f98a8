"""Recovery time: seconds from a killed rank to the first completed step after
the resume, median over N injections — Regatta (detect, cordon, replace from
the spare pool, relaunch, resume) beside a bare supervisor restarting the same
trainer, measured in the same run, injection by injection (see `BaselineGang`
for why the restart is not `torchrun --max-restarts` itself).

    .venv/bin/python bench/recovery.py --injections 10

Both sides run the same 2-rank nano trainer shaped the same way (gloo, CPU,
one `torchrun --nnodes=2` per logical node, one rank each, a checkpoint every 5
steps) at the same time, and each injection SIGKILLs rank 1 of both in the
same instant, so both recoveries start processes on the same loaded machine.
Both are timed the same way: the kill's wall time against the timestamp of
the first "step N loss" line the resumed rank 0 writes; the paired difference
is what the control plane adds. Regatta runs for real: its own SQLite and
Redis in a fresh state folder, `manage.py runserver`, a Celery worker, beat's
sweeps every 0.5 s, the local provider.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = {"model": "nano", "batch_size": 2, "warmup_steps": 2, "log_every_steps": 1,
           "heartbeat_interval_s": 0.5, "async_checkpoint": False, "step_sleep_s": 0.05,
           "max_steps": 100000, "collective_timeout_s": 30.0}
STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank 0\].* step (\d+) loss")


def step_lines(log: Path) -> list[tuple[float, int]]:
    """(wall time, step) of each 'step N loss' line of rank 0."""
    if not log.exists():
        return []
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP_LINE.match(line)
        if m:
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append((stamp, int(m.group(2))))
    return lines


def first_step_after(log: Path, after: float, timeout: float = 300.0) -> float:
    """Wall time of the first 'step N loss' line of rank 0 stamped after `after`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [stamp for stamp, _ in step_lines(log) if stamp > after]
        if later:
            return later[0]
        time.sleep(0.1)
    raise TimeoutError(f"no step after the kill in {log}")


def steps_lost(before_log: Path, after_log: Path, t_kill: float) -> int:
    """Steps trained again: from the last step the killed attempt's rank 0
    completed (the survivor may finish the step in flight after the kill)
    back to the step the relaunch resumed from (its first step, less one).
    The survivor may also have completed a step it could not log (the
    loss's all-reduce is the collective that failed): a resume past the
    last logged step lost nothing."""
    before = [step for _, step in step_lines(before_log)]
    after = [step for stamp, step in step_lines(after_log) if stamp > t_kill]
    return max(0, max(before) - (min(after) - 1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_pids(parent_pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent_pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


class BaselineGang:
    """The same trainer shaped like Regatta's attempt (one `torchrun --nnodes=2`
    per logical node, one rank each), under a supervisor with no detection
    delay and no decisions to make: the moment either torchrun exits, the rest
    of the gang is killed and the same two commands start again and resume
    from the newest checkpoint.

    `torchrun --max-restarts` itself was the intended baseline, but its
    in-place restarts of this gloo trainer failed here to re-form the
    collective (connectFullMesh refused, every retry), so the restart is done
    by this supervisor: the floor any supervisor can reach.
    """

    def __init__(self, workdir: Path):
        import json

        cfg = {**TRAINER, "checkpoint_every_steps": 5}
        self.workdir = workdir / "baseline"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "REGATTA_CONFIG": json.dumps(cfg),
                    "REGATTA_CHECKPOINT_URI": str(self.workdir / "ckpt"),
                    "REGATTA_RESUME_STEP": "latest"}
        self.env.pop("REGATTA_URL", None)
        self.generation = 0
        self.procs: list[subprocess.Popen] = []
        self.stopping = False
        self._start()
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def log(self) -> Path:
        """Rank 0's log of the gang now running."""
        return self.workdir / f"gen-{self.generation}-node-0.log"

    def _start(self) -> None:
        self.generation += 1
        port = free_port()
        procs = []
        for node_rank in (0, 1):
            log = self.workdir / f"gen-{self.generation}-node-{node_rank}.log"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                 f"--node_rank={node_rank}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                 f"--master_port={port}", "--max-restarts=0", "--monitor-interval=0.5",
                 "-m", "trainer"],
                env=self.env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                start_new_session=True))
        self.procs = procs

    def _kill_all(self) -> None:
        for proc in self.procs:
            # torchrun starts its ranks in their own sessions: kill them by pid.
            for pid in rank_pids(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def _supervise(self) -> None:
        while not self.stopping:
            if any(p.poll() is not None for p in self.procs):
                self._kill_all()
                if not self.stopping:
                    self._start()
            time.sleep(0.05)

    def kill_rank_1(self) -> None:
        victims = rank_pids(self.procs[1].pid)
        os.kill(max(victims), signal.SIGKILL)

    def kill_node_1(self) -> None:
        """Node 1 loses power: its rank and its torchrun at once."""
        victims = rank_pids(self.procs[1].pid)
        os.killpg(self.procs[1].pid, signal.SIGKILL)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.stopping = True
        self._thread.join(timeout=5)
        self._kill_all()


def start_control_plane(workdir: Path, max_hardware_restarts: int, trainer: dict,
                        checkpoint_every: int = 5, preflight: bool = False,
                        checkpoint_policy: str = "steps"):
    """Regatta for real in a fresh state folder: SQLite, the embedded Redis,
    `manage.py runserver`, a Celery worker; a 2-node job on a local cluster.
    Returns (job, cluster, stop callable)."""
    state = workdir / "state"
    port = free_port()
    # Its own database and broker in the state folder, whatever the shell
    # points at: a second run would find the first one's rows.
    for name in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(name, None)
    env = {**os.environ, "REGATTA_STATE_DIR": str(state), "REGATTA_SWEEP_INTERVAL_S": "1",
           "REGATTA_PUBLIC_URL": f"http://127.0.0.1:{port}", "DJANGO_SETTINGS_MODULE":
           "controlplane.settings"}
    os.environ.update({k: v for k, v in env.items() if k.startswith(("REGATTA", "DJANGO"))})
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from controlplane.embedded import start_redis

    redis_proc = start_redis(settings.EMBEDDED_REDIS_SOCKET)
    call_command("migrate", verbosity=0)
    procs = [
        subprocess.Popen([sys.executable, "manage.py", "runserver", "--noreload",
                          f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                         stdout=open(workdir / "web.log", "ab"), stderr=subprocess.STDOUT,
                         start_new_session=True),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "controlplane", "worker",
                          # The prefork pool, as `make run` starts it: celery 5.6's
                          # thread pool leaves a backlog draining a few tasks per 10 s.
                          "--pool=prefork", "--concurrency=2", "--without-gossip",
                          "--loglevel=WARNING"],
                         cwd=ROOT, env=env, stdout=open(workdir / "worker.log", "ab"),
                         stderr=subprocess.STDOUT, start_new_session=True),
    ]
    from clusters.models import Cluster, NodePool
    from clusters.providers import get_provider
    from clusters.reconcile import reconcile_cluster_unlocked
    from jobs import tasks
    from jobs.models import Quota, Team, TrainingJob

    cluster = job = None

    def stop():
        if job is not None:
            job.refresh_from_db()
            if not job.is_terminal:
                job.request_cancel("bench")
                tasks.reconcile_job.delay(job.id)
                time.sleep(3)
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        if cluster is not None:
            get_provider(cluster).stop_standbys()
        if redis_proc is not None:
            redis_proc.terminate()

    try:
        cluster = Cluster.objects.create(
            name="bench", provider="local",
            settings={"fleet_dir": str(workdir / "fleet"), "preflight": preflight,
                      "observe_interval_s": 0.5, "reconcile_interval_s": 1.0,
                      "heartbeat_deadline_s": 60.0})
        NodePool.objects.create(cluster=cluster, name="cpu", gpus_per_node=1, size=2,
                                spare_count=1)
        reconcile_cluster_unlocked(cluster.id)
        team = Team.objects.create(name="bench")
        Quota.objects.create(team=team, cluster=cluster, gpus=4)
        job = TrainingJob.objects.create(name="bench", team=team, cluster=cluster, num_nodes=2,
                                         gpus_per_node=1, hyperparameters=trainer,
                                         checkpoint_every_steps=checkpoint_every,
                                         checkpoint_policy=checkpoint_policy,
                                         restart_budgets={"hardware": max_hardware_restarts,
                                                          "process": max_hardware_restarts,
                                                          "code": 0})
        tasks.reconcile_job.delay(job.id)
    except BaseException:
        # Half set up: nothing it started may outlive it, or its worker
        # sweeps beside the next run.
        stop()
        raise

    return job, cluster, stop


def sweep_until(predicate, timeout=300.0):
    """Beat's sweeps every 0.5 s until `predicate()` is truthy."""
    from clusters.tasks import sweep_clusters
    from jobs.tasks import sweep_admission, sweep_jobs

    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - last > 0.5:
            sweep_jobs.delay()
            sweep_clusters.delay()
            sweep_admission.delay()
            last = time.monotonic()
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError("the job did not get there")


def kill_regatta_node(attempt, provider) -> None:
    """The local provider's node kill fault on the node of rank 1."""
    from clusters.models import Node
    from clusters.providers import pool_info

    name = next(n["node"] for n in attempt.provider_ref["nodes"] if n["node_rank"] == 1)
    node = Node.objects.select_related("pool").get(pool__cluster=attempt.job.cluster, name=name)
    provider.inject_fault(pool_info(node.pool), name, "kill")


def paired(injections: int, workdir: Path, preflight: bool,
           kill: str = "rank") -> tuple[list[float], list[float]]:
    """Both gangs train side by side; each injection SIGKILLs rank 1 of both
    in the same instant, so the two recoveries share the machine's load."""
    base = BaselineGang(workdir)
    try:
        job, cluster, stop = start_control_plane(workdir, injections + 1, TRAINER,
                                                 preflight=preflight)
    except BaseException:
        base.stop()  # a control plane that never came up (no database, say)
        raise
    from clusters.providers import get_provider

    provider = get_provider(cluster)
    base_times, ours, lost = [], [], []
    try:
        first_step_after(base.log(), 0)
        for number in range(1, injections + 1):
            attempt = sweep_until(lambda n=number: job.attempts.filter(
                number=n, state="running", last_step__gte=3).first())
            generation = base.generation
            first_step_after(base.log(), 0)
            time.sleep(2.0)
            log = Path(attempt.provider_ref["dir"]).parent / f"job-{job.id}-a{number + 1}"
            t_kill = time.time()
            if kill == "node":
                base.kill_node_1()
                kill_regatta_node(attempt, provider)
            else:
                base.kill_rank_1()
                provider.kill_rank(attempt.provider_ref, rank=1)
            sweep_until(lambda lg=log: (lg / "node-0" / "stdout.log").exists())
            ours.append(first_step_after(log / "node-0" / "stdout.log", t_kill) - t_kill)
            lost.append(steps_lost(Path(attempt.provider_ref["dir"]) / "node-0" / "stdout.log",
                                   log / "node-0" / "stdout.log", t_kill))
            sweep_until(lambda g=generation: base.generation > g)
            base_times.append(first_step_after(base.log(), t_kill) - t_kill)
            warm = sum(bool(json.loads((log / f"node-{i}" / "launcher.json").read_text())
                            .get("warm")) for i in (0, 1))
            print(f"  injection {number}: baseline {base_times[-1]:.2f} s, "
                  f"regatta {ours[-1]:.2f} s, difference {ours[-1] - base_times[-1]:+.2f} s, "
                  f"regatta steps lost {lost[-1]}, warm standbys {warm} of 2", flush=True)
    finally:
        try:
            stop()
        finally:
            base.stop()  # its gang must not outlive the bench, however it ended
    return base_times, ours, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--injections", type=int, default=10)
    parser.add_argument("--preflight", action=argparse.BooleanOptionalAction, default=True,
                        help="run the preflight all-reduce before every relaunch, as a "
                             "cluster does by default (--no-preflight leaves it out)")
    parser.add_argument("--kill", choices=("rank", "node"), default="rank",
                        help="what each injection kills: rank 1's process (the OOM "
                             "killer's way), or rank 1's whole node (the node kill fault)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="regatta-recovery-"))
    print(f"work folder: {workdir}")
    print("baseline: the same 2-node gang, relaunched the moment a torchrun exits")
    print("regatta: detect, cordon, replace from the spare pool, "
          f"{'preflight, ' if args.preflight else ''}relaunch, resume")
    print(f"each injection kills {'the node of ' if args.kill == 'node' else ''}rank 1")
    base, ours, lost = paired(args.injections, workdir, args.preflight, args.kill)
    mb, mo = statistics.median(base), statistics.median(ours)
    md = statistics.median(o - b for o, b in zip(ours, base, strict=True))
    print(f"median seconds from kill to first step after resume over {args.injections}:")
    print(f"  baseline relaunch:       {mb:.2f} s")
    print(f"  regatta:                 {mo:.2f} s  (ratio {mo / mb:.2f}x)")
    if len(ours) >= 2:
        p95 = statistics.quantiles(ours, n=20, method="inclusive")[18]
        print(f"  regatta p95:             {p95:.2f} s  (goal: p50 <= 8 s, p95 <= 15 s)")
    print(f"  median paired difference {md:+.2f} s  (what the control plane adds; goal <= +2 s)")
    print(f"  steps lost per failure:  median {statistics.median(lost):g}, max {max(lost)} "
          "(a checkpoint every 5 steps; goal <= 1)")

if __name__ == "__main__":
    main()
