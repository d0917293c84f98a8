"""The trainer's GPU acceptance run (issue 11), one command on one GPU:

    python bench/gpu_acceptance.py                 # on the GPU, < 10 minutes
    python bench/gpu_acceptance.py --cpu-smoke     # the same checks, tiny, on CPU

Each run's torchrun is handed to a warm standby (regatta/node/standby.py),
as on the local fleet; a launch it does not take goes cold, and the output
says which did.

It needs only the worker image's Python (torch and the `regatta-worker`
package; no Django, no control plane: a small HTTP server in this process
stands in for the worker API, to collect checkpoint reports and events).
It prints one table:

1. throughput: a bare loop (the trainer's model, fused AdamW, bf16 autocast,
   torch.compile, no checkpoints, no reporting) vs the trainer under torchrun
   with its production defaults (reporting on, checkpoints every 50 steps,
   async), tokens/s and MFU, for the `small` and `medium` presets;
2. DDP and FSDP runs, each with at least 3 periodic async saves: every save
   committed and verified, blocking seconds per save;
3. blocking seconds of an async save vs a synchronous save of the same state;
4. a rank SIGKILLed mid-run, then the run resumed from its newest verified
   checkpoint, to the end;
5. the exit code of every run.

Exit status 0 when every check passed, 1 otherwise. `--json PATH` also
writes the figures.
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
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# torchrun as a module of this Python: a GPU machine's Python may keep its
# scripts outside the folder of its executable.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
WORKER_PACKAGE = Path(__file__).resolve().parent.parent / "worker_image"
STEP_LINE = re.compile(r"\[rank 0\].* step (\d+) loss \S+ .* (\d+) tok/s")


@dataclass
class Profile:
    presets: tuple[str, ...]
    batch: dict[str, int]
    steps: int  # throughput runs
    log_every: int
    ckpt_preset: str
    ckpt_steps: int
    ckpt_every: int
    compile: bool  # the throughput runs; checkpoint and kill runs stay eager (time)
    nproc: int = 1
    overrides: dict = field(default_factory=dict)


GPU = Profile(presets=("small", "medium"), batch={"small": 16, "medium": 16}, steps=120,
              log_every=10, ckpt_preset="small", ckpt_steps=80, ckpt_every=20, compile=True)
CPU_SMOKE = Profile(presets=("nano",), batch={"nano": 8}, steps=12, log_every=2,
                    ckpt_preset="nano", ckpt_steps=16, ckpt_every=4, compile=False, nproc=2,
                    overrides={"warmup_steps": 2})


class Plane:
    """A stand-in for the control plane's worker endpoints: records bodies."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []
        plane = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDK uses it

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                kind = self.path.rstrip("/").rsplit("/", 1)[1]
                plane.records.append((kind, body))
                reply = json.dumps({"directives": {}} if kind == "heartbeat" else {}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self, attempt: int) -> dict:
        return {"REGATTA_URL": self.url, "REGATTA_TOKEN": "rgw_acceptance",
                "REGATTA_JOB_ID": "1", "REGATTA_ATTEMPT_ID": str(attempt),
                "REGATTA_NODE": socket.gethostname()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TrainerRun:
    name: str
    code: int | None
    log: str
    checkpoints: list[dict]
    events: list[dict]
    ckpt: Path
    seconds: float

    def tokens_per_s(self) -> float | None:
        rates = [int(m.group(2)) for m in STEP_LINE.finditer(self.log)]
        # The first windows hold compilation and warm-up.
        steady = rates[2:] if len(rates) > 3 else rates[1:]
        return statistics.median(steady) if steady else None


class Launch:
    """One torchrun launch: cold (`Popen`, torchrun's agent), or handed to
    the warm standby, whose launcher records the agent in `launcher.json`
    and how it ended in `exit.json` (regatta/node/launcher.py)."""

    def __init__(self, folder: Path, cold: subprocess.Popen | None = None) -> None:
        self.folder, self.cold = folder, cold
        self.launcher: int | None = None
        if cold is None:
            deadline = time.monotonic() + 30
            while not (folder / "launcher.json").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            self.launcher = json.loads((folder / "launcher.json").read_text())["pid"]

    @property
    def agent(self) -> int:
        if self.cold is not None:
            return self.cold.pid
        return json.loads((self.folder / "launcher.json").read_text())["torchrun_pid"]

    def poll(self) -> int | None:
        if self.cold is not None:
            return self.cold.poll()
        done = self.folder / "exit.json"
        if done.exists():
            return json.loads(done.read_text())["torchrun_returncode"]
        return None if Path(f"/proc/{self.launcher}").exists() else -signal.SIGKILL

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("torchrun", timeout)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        """SIGKILL its ranks (torchrun starts each in a session of its own),
        its agent and, warm, its launcher."""
        for pid in [*_rank_pids(self.agent), self.agent, self.launcher]:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.cold is not None:
            self.cold.wait()


class Runner:
    # Each run's torchrun is handed to a warm standby (regatta/node/standby.py),
    # as a local fleet's node keeps one: Python, torch and the trainer
    # imported once for all the runs, so that each one's agent and ranks are
    # forked with them (on 2 CPU cores a cold launch spent ~9 CPU-s on those
    # imports, most of a smoke run's). A launch it does not take goes cold.
    NODE = "acceptance"

    def __init__(self, root: Path, profile: Profile, cpu: bool) -> None:
        self.root, self.profile, self.cpu = root, profile, cpu
        self.plane = Plane()
        self.attempt = 0
        self.runs: list[TrainerRun] = []
        self.fleet = root / "standby"
        self.launched: dict[str, str] = {}  # run name: warm, or cold and why

    def _base_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
        env["OMP_NUM_THREADS"] = "1"
        if self.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def start_standby(self) -> None:
        """Started ahead of the first run: its imports overlap the bare loop."""
        from regatta.node import standby

        standby.ensure(self.fleet, [self.NODE], sys.executable, self._base_env())

    def stop_standby(self) -> None:
        from regatta.node import standby

        standby.stop_idle(self.fleet)

    def _hand_over(self, folder: Path, cmd: list[str], env: dict) -> bool:
        from regatta.node import standby

        self.start_standby()  # renews its lease; a new one if it left
        deadline = time.monotonic() + 60
        while (state := standby.state(self.fleet, self.NODE)) in ("starting", "") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        taken = state == "ready" and standby.hand_over(self.fleet, self.NODE, folder, cmd, env,
                                                       sys.executable)
        self.launched[folder.name] = "warm" if taken else f"cold (standby {state or 'absent'})"
        return taken

    def config(self, preset: str, compile_: bool = False, **extra) -> dict:
        p = self.profile
        return {"model": preset, "batch_size": p.batch[preset], "log_every_steps": p.log_every,
                "compile": compile_, "heartbeat_interval_s": 1.0, **p.overrides, **extra}

    def start(self, name: str, config: dict, ckpt: Path) -> tuple[Launch, int, Path]:
        self.attempt += 1
        folder = self.root / name
        env = {**self._base_env(), **self.plane.env(self.attempt),
               "REGATTA_CONFIG": json.dumps(config), "REGATTA_CHECKPOINT_URI": str(ckpt),
               "REGATTA_STATUS_DIR": str(folder / "status")}
        log = folder / "stdout.log"
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [*TORCHRUN, "--nnodes=1", f"--nproc-per-node={self.profile.nproc}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               "-m", "trainer", "--staging-dir", str(folder / "staging")]
        if self._hand_over(folder, cmd, env):
            return Launch(folder), self.attempt, log
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        return Launch(folder, proc), self.attempt, log

    def finish(self, name: str, proc: Launch, attempt: int, log: Path, ckpt: Path, t0: float,
               timeout: float = 420) -> TrainerRun:
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # the ranks would hold the GPU for the next run
            returncode = proc.poll()
        status = self.root / name / "status" / "rank-0.json"
        code = json.loads(status.read_text())["exit_code"] if status.exists() else returncode
        run = TrainerRun(name, code, log.read_text(errors="replace"),
                         self._bodies("checkpoints", attempt), self._bodies("events", attempt),
                         ckpt, time.perf_counter() - t0)
        self.runs.append(run)
        return run

    def _bodies(self, kind: str, attempt: int) -> list[dict]:
        # `tag_attempts` marks each body with the attempt of its request path.
        return [b for k, b in self.plane.records if k == kind and b.get("_attempt") == attempt]

    def run(self, name: str, config: dict, ckpt: Path | None = None) -> TrainerRun:
        ckpt = ckpt or self.root / name / "ckpt"
        t0 = time.perf_counter()
        proc, attempt, log = self.start(name, config, ckpt)
        return self.finish(name, proc, attempt, log, ckpt, t0)


def tag_attempts(plane: Plane) -> None:
    """Patch the handler's records with the attempt id from the request path."""
    handler = plane.server.RequestHandlerClass
    original = handler.do_POST

    def do_post(self):
        attempt = int(self.path.split("/attempts/")[1].split("/")[0])
        before = len(plane.records)
        original(self)
        for _, body in plane.records[before:]:
            body["_attempt"] = attempt

    handler.do_POST = do_post


# -- the bare loop ------------------------------------------------------------------

def bare_loop(preset: str, batch: int, steps: int, compile_: bool, cpu: bool) -> dict:
    import torch
    from regatta.gpu import peak_flops
    from trainer.config import MODEL_PRESETS
    from trainer.model import GPT, GPTShape

    device = torch.device("cpu" if cpu or not torch.cuda.is_available() else "cuda")
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    shape = GPTShape(**MODEL_PRESETS[preset])
    model = GPT(shape).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda" or None)
    step_fn = torch.compile(model) if compile_ else model
    x = torch.randint(0, 256, (batch, shape.block_size), device=device)
    y = torch.randint(0, 256, (batch, shape.block_size), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step() -> None:
        with autocast:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(max(3, steps // 10)):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    tokens_s = batch * shape.block_size * steps / (time.perf_counter() - start)
    peak = peak_flops(device)
    mfu = model.flops_per_token() * tokens_s / peak if peak else None
    result = {"tokens_per_s": tokens_s, "mfu": mfu, "flops_per_token": model.flops_per_token(),
              "peak": peak, "device": torch.cuda.get_device_name(device)
              if device.type == "cuda" else "cpu"}
    return result


# -- the checks -------------------------------------------------------------------------

class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.ok = True

    def add(self, check: str, value: str, passed: bool | None) -> None:
        mark = "-" if passed is None else ("PASS" if passed else "FAIL")
        if passed is False:
            self.ok = False
        self.rows.append((check, value, mark))
        # Each row as it is measured, so that a run cut short (a time limit)
        # still shows what it found; the whole table follows at the end.
        print(f"gpu_acceptance: {check}: {value} [{mark}]", file=sys.stderr, flush=True)

    def print(self) -> None:
        w = max(len(r[0]) for r in self.rows)
        v = max(len(r[1]) for r in self.rows)
        print(f"{'check'.ljust(w)}  {'figure'.ljust(v)}  result")
        for check, value, mark in self.rows:
            print(f"{check.ljust(w)}  {value.ljust(v)}  {mark}")


def fmt_mfu(mfu: float | None) -> str:
    return f"{mfu:.1%}" if mfu else "n/a"


def throughput(runner: Runner, table: Table, figures: dict) -> None:
    p = runner.profile
    for preset in p.presets:
        bare = bare_loop(preset, p.batch[preset], max(20, p.steps // 4), p.compile, runner.cpu)
        if not runner.cpu:
            import torch

            torch.cuda.empty_cache()  # the bare loop's memory, before the trainer starts
        # Production defaults: reporting on, an async save mid-window.
        run = runner.run(f"throughput-{preset}", runner.config(
            preset, p.compile, max_steps=p.steps, checkpoint_every_steps=max(p.steps // 2, 1)))
        tps = run.tokens_per_s()
        ratio = tps / bare["tokens_per_s"] if tps else None
        mfu = (bare["flops_per_token"] * tps / bare["peak"]) if tps and bare["peak"] else None
        figures[preset] = {"bare": bare, "trainer_tokens_per_s": tps, "ratio": ratio,
                           "trainer_mfu": mfu, "exit": run.code}
        table.add(f"{preset}: bare loop tokens/s (MFU)",
                  f"{bare['tokens_per_s']:,.0f} ({fmt_mfu(bare['mfu'])})", None)
        table.add(f"{preset}: trainer tokens/s (MFU)",
                  f"{tps or 0:,.0f} ({fmt_mfu(mfu)})", run.code == 0 and tps is not None)
        goal = None if runner.cpu else (ratio or 0) >= 0.97
        table.add(f"{preset}: trainer / bare loop (goal >= 97%)",
                  f"{ratio:.1%}" if ratio else "n/a", goal)
        if preset == "medium" and not runner.cpu:
            table.add("medium: trainer MFU (goal >= 45%)", fmt_mfu(mfu), (mfu or 0) >= 0.45)


def saves(runner: Runner, table: Table, figures: dict) -> None:
    p = runner.profile
    for strategy in ("ddp", "fsdp"):
        run = runner.run(f"saves-{strategy}", runner.config(
            p.ckpt_preset, strategy=strategy, max_steps=p.ckpt_steps,
            checkpoint_every_steps=p.ckpt_every, keep_last=100))
        periodic = [c for c in run.checkpoints if c["step"] < p.ckpt_steps]
        from regatta.storage import open_storage

        store = open_storage(str(run.ckpt))
        verified = all(store.verify(c["step"]) == (True, "ok") for c in run.checkpoints)
        failed = [e for e in run.events if e["kind"] == "checkpoint_failed"]
        blocking = [c["blocking_seconds"] for c in periodic]
        figures[f"saves_{strategy}"] = {"checkpoints": run.checkpoints, "failed": failed,
                                        "exit": run.code}
        table.add(f"{strategy}: async saves committed and verified",
                  f"{len(periodic)} periodic + final, {len(failed)} failed",
                  run.code == 0 and len(periodic) >= 3 and verified and not failed)
        if blocking:
            table.add(f"{strategy}: async save blocking s (median, max)",
                      f"{statistics.median(blocking):.3f}, {max(blocking):.3f}", None)
    sync = runner.run("saves-sync", runner.config(
        p.ckpt_preset, max_steps=p.ckpt_steps, checkpoint_every_steps=p.ckpt_every,
        async_checkpoint=False, keep_last=100))
    sync_block = [c["blocking_seconds"] for c in sync.checkpoints]
    async_block = [c["blocking_seconds"] for c in figures["saves_ddp"]["checkpoints"]
                   if c["step"] < p.ckpt_steps]
    if sync_block and async_block:
        s, a = statistics.median(sync_block), statistics.median(async_block)
        figures["blocking"] = {"sync_s": s, "async_s": a, "ratio": a / s if s else None}
        table.add("blocking: async vs sync save s (goal <= 5%)",
                  f"{a:.3f} vs {s:.3f} ({a / s:.1%})",
                  None if runner.cpu else a <= 0.05 * s)


def kill_and_resume(runner: Runner, table: Table, figures: dict) -> None:
    from regatta.storage import open_storage

    p = runner.profile
    ckpt = runner.root / "kill" / "ckpt"
    config = runner.config(p.ckpt_preset, max_steps=p.ckpt_steps,
                           checkpoint_every_steps=p.ckpt_every, keep_last=100,
                           **({"faults": {"step_sleep_s": 0.1}} if runner.cpu else {}))
    t0 = time.perf_counter()
    proc, attempt, log = runner.start("kill", config, ckpt)
    store = open_storage(str(ckpt))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and len(store.committed_steps()) < 2:
        time.sleep(0.2)
    victim = _rank_pids(proc.agent)
    killed = bool(victim) and proc.poll() is None
    for pid in victim[-1:]:
        os.kill(pid, signal.SIGKILL)
    first = runner.finish("kill", proc, attempt, log, ckpt, t0)
    newest = store.newest_verified()
    resumed = runner.run("resume", config, ckpt)
    ok = killed and resumed.code == 0 and f"resumed from {store.step_uri(newest)}" in resumed.log \
        if newest is not None else False
    figures["kill"] = {"killed_exit": first.code, "newest_verified": newest,
                       "resumed_exit": resumed.code}
    table.add("SIGKILL a rank, resume from newest verified",
              f"killed (exit {first.code}) after step-{newest}; resumed, exit {resumed.code}", ok)


def _rank_pids(agent: int) -> list[int]:
    """torchrun's ranks: its agent's children, started cold or forked warm."""
    ranks = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == agent:
                ranks.append(int(entry))
    return sorted(ranks)


def use_checkout_worker_package() -> None:
    """Where the worker package is not installed (a GPU machine's own Python
    with torch, run from a checkout), take it from the checkout: on this
    process's path and, through PYTHONPATH, on the ranks'."""
    try:
        import regatta  # noqa: F401
        import trainer  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(WORKER_PACKAGE))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(WORKER_PACKAGE), os.environ.get("PYTHONPATH")) if p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny model, few steps, gloo on CPU: the checks, not the figures")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    args = ap.parse_args(argv)
    use_checkout_worker_package()
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_acceptance: no CUDA device; run it on a GPU, or with --cpu-smoke",
              file=sys.stderr)
        return 2
    profile = CPU_SMOKE if args.cpu_smoke else GPU
    root = Path(tempfile.mkdtemp(prefix="regatta-acceptance-"))
    runner = Runner(root, profile, cpu=args.cpu_smoke)
    tag_attempts(runner.plane)
    table, figures = Table(), {"torch": torch.__version__}
    started = time.perf_counter()
    runner.start_standby()
    try:
        throughput(runner, table, figures)
        saves(runner, table, figures)
        kill_and_resume(runner, table, figures)
    finally:
        runner.stop_standby()
    figures["launched"] = runner.launched
    warm = sum(how == "warm" for how in runner.launched.values())
    cold = [f"{name} {how}" for name, how in runner.launched.items() if how != "warm"]
    print(f"launches: {warm} of {len(runner.launched)} through the warm standby"
          + (f"; {', '.join(cold)}" if cold else ""))
    for run in runner.runs:
        table.add(f"exit code: {run.name}", f"{run.code} ({run.seconds:.0f} s)",
                  run.code == 0 or run.name == "kill")
    device = figures.get(profile.presets[0], {}).get("bare", {}).get("device", "?")
    print(f"device: {device}; torch {torch.__version__}; "
          f"{time.perf_counter() - started:.0f} s in all; run folders in {root}")
    table.print()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if table.ok else 1


if __name__ == "__main__":
    sys.exit(main())
