"""Real torchrun launches (warm through a standby, or cold) and a real HTTP
control-plane stand-in for the trainer tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.waiting import eventually

VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")

# ~0.14M parameters: big enough to learn, small enough for 2 shared cores.
NANO = {"model": "nano", "batch_size": 8, "warmup_steps": 2, "lr": 1e-3,
        "log_every_steps": 2, "heartbeat_interval_s": 0.2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`. torchrun puts each rank in its own session,
    so killing torchrun's process group alone would leave ranks behind."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Run:
    def __init__(self, proc: subprocess.Popen, log_path: Path, status_dir: Path, ckpt: str):
        self.proc, self.log_path, self.status_dir, self.ckpt = proc, log_path, status_dir, ckpt

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def statuses(self) -> dict[int, dict]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())
                for p in self.status_dir.glob("rank-*.json")}

    def exit_codes(self) -> dict[int, int]:
        return {rank: s["exit_code"] for rank, s in self.statuses().items()}

    def ranks(self) -> list[int]:
        return ranks_of(self.proc)

    def wait_for(self, predicate, timeout: float = 60, what: str = "condition") -> None:
        """Until `predicate` holds; a run that exits first fails at once. Either
        failure carries the run's log."""
        def holds() -> bool:
            if predicate():
                return True
            if self.proc.poll() is not None:
                raise RunExited(f"run exited before {what}:\n{self.log()[-3000:]}")
            return False

        try:
            eventually(holds, timeout=timeout, interval=0.05, what=what)
        except RunExited:
            raise
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{self.log()[-3000:]}") from None

    def kill(self) -> None:
        kill_tree(self.proc)

    def dump_stacks(self) -> None:
        """Every thread's Python stack of every rank, into the log: SIGABRT
        fires faulthandler (PYTHONFAULTHANDLER, set for every launch here),
        which writes them before the rank dies. For a run that hung."""
        for pid in self.ranks():
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
        time.sleep(2)


class RunExited(AssertionError):
    """The run ended before what a test waited for."""


class Launcher:
    """The built-in trainer under torchrun, warm through the standby
    (`start_torchrun`) unless `warm` is False."""

    def __init__(self, root: Path, warm: bool = True):
        self.root, self.warm = root, warm
        self.runs: list[Run] = []

    def start(self, config: dict, ckpt: str | Path, *, name: str = "run", nproc: int = 2,
              env: dict | None = None, resume: str | None = None) -> Run:
        folder = self.root / f"{name}-{len(self.runs)}"
        folder.mkdir(parents=True)
        status_dir = folder / "status"
        launch = {"REGATTA_CONFIG": json.dumps({**NANO, **config}),
                  "REGATTA_CHECKPOINT_URI": str(ckpt), "REGATTA_STATUS_DIR": str(status_dir)}
        if resume is not None:
            launch["REGATTA_RESUME_STEP"] = resume
        launch.update(env or {})
        argv = ["--nnodes=1", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--monitor-interval=0.2",
                "-m", "trainer", "--staging-dir", str(folder / "staging")]
        proc = start_torchrun(argv, launch, folder, warm=self.warm)
        run = Run(proc, folder / "stdout.log", status_dir, str(ckpt))
        self.runs.append(run)
        return run

    def run(self, config: dict, ckpt: str | Path, timeout: float = 120, **kwargs) -> Run:
        run = self.start(config, ckpt, **kwargs)
        try:
            run.wait(timeout)
        except subprocess.TimeoutExpired:
            run.dump_stacks()
            run.kill()
            raise AssertionError(f"run timed out:\n{run.log()[-12000:]}") from None
        return run

    def cleanup(self) -> None:
        for run in self.runs:
            run.kill()


class Standby:
    """This test process's warm standby (regatta/node/standby.py), the one
    the local fleet keeps on each node: Python, torch, torchrun's agent and
    the trainer imported once. A launch handed to it forks torchrun's agent,
    and the agent forks each rank (`--start-method=fork`), instead of starting
    Python and importing torch three times (~8 CPU-s on two cores, most of a
    short run). The ranks run the same entry point under the same torchrun
    agent, with the launch's own environment: the local fleet's default path.
    A launch it cannot take (not ready in time, refused) goes cold, as the
    provider's does. `imports`: further modules it imports ahead, as a local
    cluster's `standby_imports` names them."""

    READY_WAIT_S = 15.0

    def __init__(self, node: str = "trainer-tests", imports: tuple[str, ...] = ()) -> None:
        self.node, self.imports = node, imports
        self.fleet: Path | None = None

    def start(self) -> None:
        """Start it ahead of the first launch (it takes seconds to import)."""
        from regatta.node import standby

        if self.fleet is None:
            self.fleet = Path(tempfile.mkdtemp(prefix="regatta-test-standby-"))
        further = {standby.IMPORTS: ",".join(self.imports)} if self.imports else {}
        standby.ensure(self.fleet, [self.node], sys.executable, {**_launch_env({}), **further})

    def take(self, argv: list[str], env: dict, folder: Path) -> WarmTorchrun | None:
        from regatta.node import standby
        from regatta.node.files import read_json

        self.start()  # renews the lease; a new one if it left
        info = standby.standby_dir(self.fleet, self.node) / standby.INFO
        deadline = time.monotonic() + self.READY_WAIT_S
        while time.monotonic() < deadline:
            state = read_json(info, {}).get("state")
            if state == "ready":
                break
            if state not in ("starting", None):
                return None
            time.sleep(0.05)
        if not standby.hand_over(self.fleet, self.node, folder,
                                 [sys.executable, "-m", "torch.distributed.run", *argv],
                                 env, sys.executable):
            return None
        return WarmTorchrun(folder)

    def stop(self) -> None:
        from regatta.node import standby

        if self.fleet is not None:
            standby.stop_idle(self.fleet)
            shutil.rmtree(self.fleet, ignore_errors=True)
            self.fleet = None


STANDBY = Standby()
# The framework programs' (test_integrations.py): the modules their ranks
# spend seconds importing, imported once here. `import transformers` alone
# is lazy; its Trainer and TRL's SFTTrainer are what cost.
FRAMEWORKS_STANDBY = Standby("framework-tests", imports=(
    "transformers.trainer", "lightning", "trl.trainer.sft_trainer"))


class WarmTorchrun:
    """A torchrun agent the standby forked, with what tests use of a Popen:
    `pid` (the agent's: its children are the ranks), `poll`, `wait`,
    `returncode`, `send_signal`. It is not this process's child: its
    launcher records it in `launcher.json` and how it ended in `exit.json`
    (regatta/node/launcher.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.returncode: int | None = None
        launcher = folder / "launcher.json"
        eventually(launcher.exists, timeout=30, interval=0.02, what="the standby's launcher.json")
        info = json.loads(launcher.read_text())
        self.pid, self.launcher = info["torchrun_pid"], (info["pid"], info["starttime"])

    def poll(self) -> int | None:
        from regatta.node import procs

        if self.returncode is None:
            done = self.folder / "exit.json"
            if done.exists():
                self.returncode = json.loads(done.read_text())["torchrun_returncode"]
            elif not procs.is_running(*self.launcher) and not done.exists():
                # Gone, and (read again: it writes exit.json before it
                # exits) without a word: killed.
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("torchrun (warm)", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        kill_tree(self)


def _launch_env(env: dict) -> dict:
    """A launch's environment: this one without Regatta's own variables and
    pytest's name of the test (a standby with imports of its own refuses a
    launch whose other variables differ from its birth), one thread per
    rank, torch.compile's code generation in the rank itself, unbuffered
    output, faulthandler on (`Run.dump_stacks`), then `env`.

    Inductor's default on two cores is a pool of compile workers per rank,
    each a fresh Python importing torch: on the suite's shared cores (and
    its kernels mostly cached from the run before) the pool cost more than
    it saved, 119 against 74 CPU-s for the two compiled resume tests.
    tests/clusters/providers/local/test_standby_compile.py starts the pool
    from a forked rank, as the local fleet does by default."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("REGATTA_") and k != "PYTEST_CURRENT_TEST"}
    return {**base, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **env}


def start_torchrun(argv: list[str], env: dict, folder: Path, *, warm: bool = True,
                   standby: Standby = STANDBY):
    """torchrun `argv` (its options and the program) with `env` over the
    launch environment, in `folder`, its output (agent and ranks) in
    `folder/stdout.log`. Warm through `standby` unless `warm` is False or
    it cannot take the launch; cold: a torchrun process of its own. Returns
    a Popen or a `WarmTorchrun`."""
    folder.mkdir(parents=True, exist_ok=True)
    full = _launch_env(env)
    if warm:
        taken = standby.take(argv, full, folder)
        if taken is not None:
            return taken
    with open(folder / "stdout.log", "ab") as log:
        return subprocess.Popen([TORCHRUN, *argv], stdout=log, stderr=subprocess.STDOUT,
                                env=full, cwd=folder, start_new_session=True)


def ranks_of(proc) -> list[int]:
    """The ranks of a torchrun, warm or cold: its agent's children."""
    from regatta.node import procs

    return [pid for pid in descendants(proc.pid) if (procs.stat(pid) or (None,))[0] == proc.pid]


def kill_tree(proc) -> None:
    """SIGKILL a torchrun (warm: its launcher too) and everything below it."""
    pids = [proc.pid, *descendants(proc.pid)]
    if isinstance(proc, WarmTorchrun):
        pids.insert(0, proc.launcher[0])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class ControlPlane:
    """A real HTTP server standing in for the control plane's worker API."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.directives: dict = {"checkpoint_request": None, "stop": False,
                                 "checkpoint_interval_steps": None}
        self.on_request = None  # hook(record) run under the lock, may edit directives
        # hook(record) -> HTTP status to answer instead of 200 (e.g. 503: the
        # request was seen, then failed, as behind a dying proxy), or None.
        self.status_for = None
        self.lock = threading.Lock()
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if plane.delay_s:  # a slow server on purpose, not a wait
                    time.sleep(plane.delay_s)
                kind = self.path.rstrip("/").rsplit("/", 1)[1]
                record = {"path": self.path, "kind": kind, "body": body,
                          "auth": self.headers.get("Authorization"), "time": time.time()}
                with plane.lock:
                    plane.requests.append(record)
                    if plane.on_request:
                        plane.on_request(record)
                    status = (plane.status_for and plane.status_for(record)) or 200
                    record["status"] = status
                    reply = ({"directives": dict(plane.directives)} if kind == "heartbeat"
                             else {"stored": len(body.get("points", []))})
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def env(self, attempt: int = 7) -> dict:
        return {"REGATTA_URL": self.url, "REGATTA_TOKEN": "rgw_test", "REGATTA_JOB_ID": "3",
                "REGATTA_ATTEMPT_ID": str(attempt), "REGATTA_NODE": "local-a-0"}

    def of_kind(self, kind: str, accepted_only: bool = False) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["kind"] == kind
                    and (not accepted_only or r["status"] == 200)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def load_checkpoint(step_dir: str | Path, out: Path) -> dict:
    """A whole DCP checkpoint as plain tensors (no process group needed)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(step_dir), str(out))
    return torch.load(out, weights_only=False)


def flat_tensors(tree, prefix: str = "") -> dict:
    import torch

    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat_tensors(v, f"{prefix}{i}."))
    elif isinstance(tree, torch.Tensor):
        out[prefix.rstrip(".")] = tree
    return out


def losses(log: str) -> list[float]:
    return [float(line.split(" loss ")[1].split()[0]) for line in log.splitlines()
            if "[rank 0]" in line and " loss " in line and "val_loss" not in line]
