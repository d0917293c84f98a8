"""Launching, observing and stopping attempts on the local fleet.

An attempt lives in `<fleet>/attempts/<name>/`: `ref.json` (what `launch`
returned) and one `node-<i>/` per placement holding `launcher.json`,
`exit.json`, `stdout.log` and `status/rank-<r>.json`. Everything `observe`
and `stop` need is on disk or in /proc, so any process can call them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from regatta import contract
from regatta.node import launcher, procs, standby
from regatta.node.files import file_lock, read_json, write_json

from controlplane.lib.errors import PermanentError, TemporaryError

from ..base import AttemptStatus, LaunchRequest, NodeProcess
from ..program import torchrun_program
from .environment import rank_environment

LOG_TAIL_LINES = 40
_LAUNCHER_START_S = 15.0
# Where no standby of the fleet is ready to fork them from, the gang's nodes'
# next standbys start this long after a launch, once the gang's own start-up
# (the same imports) no longer competes with them for the CPUs.
STANDBY_AFTER_LAUNCH_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


TORCHRUN_SHUTDOWN_TIMEOUT_S = 600


def torchrun_argv(python: str, nnodes: int, node_rank: int | str, nproc: int, port: int | str,
                  command: tuple[str, ...], master_addr: str = "127.0.0.1") -> list[str]:
    """One node's torchrun. `node_rank`, `port` and `master_addr` may be
    placeholders that a launcher fills in on the node (the Slurm provider's
    batch script knows them only once Slurm placed the job)."""
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--node_rank={node_rank}", f"--nproc_per_node={nproc}",
        f"--master_addr={master_addr}", f"--master_port={port}",
        "--max-restarts=0", "--monitor-interval=0.5",
        # torchrun would SIGKILL its ranks 30 s after a SIGTERM by default,
        # cutting an emergency checkpoint short; stop()'s grace is the bound.
        f"--shutdown-timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}",
        # `--` ends torchrun's options: nothing of the program's is read as one.
        *torchrun_program(command),
    ]


def spawn_launcher(python: str, node_dir: Path, argv: list[str], env: dict) -> None:
    """Start the detached launcher; it forks away, so this returns quickly."""
    node_dir.mkdir(parents=True, exist_ok=True)
    with open(node_dir / "launcher.err", "ab") as err:
        first = subprocess.Popen(
            launcher.command(python, "run", "--dir", str(node_dir), "--", *argv),
            env=env, cwd=node_dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=err, start_new_session=True,
        )
    first.wait(timeout=_LAUNCHER_START_S)


def _wait_for(path: Path, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = read_json(path)
        if data:
            return data
        time.sleep(0.02)
    raise TemporaryError(f"launcher did not start: no {path}", delay=5.0)


def launch(fleet: Path, request: LaunchRequest, python: str = sys.executable,
           standbys: bool = False, node_env: dict[str, dict] | None = None,
           standby_imports: tuple[str, ...] = ()) -> dict:
    """Start the attempt's gang, one detached torchrun per placement;
    `node_env` adds variables per node (its GPUs: devices.py)."""
    if not request.placements:
        raise PermanentError(f"attempt {request.name}: no placements")
    attempt_dir = fleet / "attempts" / request.name
    with file_lock(fleet / "attempts" / f"{request.name}.lock"):
        existing = read_json(attempt_dir / "ref.json")
        if existing:
            return existing
        # A launch that died half-way (no ref.json) is started over, cleanly.
        _discard(attempt_dir)
        try:
            ref = _start(fleet, attempt_dir, request, python, standbys, node_env or {})
        except BaseException:
            _discard(attempt_dir)
            raise
    if standbys:
        # For the next launch on these nodes: a survivor of the next failure
        # restarts warm as the promoted spare does.
        standby.ensure(fleet, [entry["node"] for entry in ref["nodes"]], python,
                       standby_environment(standby_imports), delay_s=STANDBY_AFTER_LAUNCH_S)
    return ref


def standby_environment(imports: tuple[str, ...] = ()) -> dict:
    """A standby's birth environment: what every rank of the node gets
    before its launch's own variables (which the launch hands over), and
    the cluster's further modules for it to import (`standby_imports`)."""
    further = {contract.STANDBY_IMPORTS: ",".join(imports)} if imports else {}
    return {**rank_environment({}), "OMP_NUM_THREADS": "1", **further}


def _discard(attempt_dir: Path) -> None:
    leftovers = procs.scan(attempt_dir=str(attempt_dir))
    procs.kill_hard(leftovers)
    procs.wait_gone(leftovers, 5.0)
    for pattern in ("node-*/*.json", "node-*/status/*.json"):
        for stale in attempt_dir.glob(pattern):
            stale.unlink(missing_ok=True)


def _start(fleet: Path, attempt_dir: Path, request: LaunchRequest, python: str,
           standbys: bool, node_env: dict[str, dict]) -> dict:
    port = free_port()
    nnodes = len(request.placements)
    nodes = []
    for placement in sorted(request.placements, key=lambda p: p.node_rank):
        node_dir = attempt_dir / f"node-{placement.node_rank}"
        (node_dir / "status").mkdir(parents=True, exist_ok=True)
        env = node_environment(fleet, attempt_dir, request, placement.node, node_dir,
                               node_env.get(placement.node, {}))
        argv = torchrun_argv(python, nnodes, placement.node_rank, request.nproc_per_node,
                             port, tuple(request.command))
        write_json(node_dir / "placement.json", {
            "node": placement.node, "node_rank": placement.node_rank, "argv": argv,
        })
        warm = standbys and standby.hand_over(fleet, placement.node, node_dir, argv, env, python)
        if not warm:
            spawn_launcher(python, node_dir, argv, env)
    for placement in sorted(request.placements, key=lambda p: p.node_rank):
        info = _wait_for(attempt_dir / f"node-{placement.node_rank}" / "launcher.json",
                         _LAUNCHER_START_S)
        nodes.append({"node": placement.node, "node_rank": placement.node_rank,
                      "pid": info["pid"], "pgid": info["pgid"], "warm": bool(info.get("warm"))})
    ref = {"dir": str(attempt_dir), "nodes": nodes, "master_port": port}
    write_json(attempt_dir / "ref.json", ref)
    return ref


def node_environment(fleet: Path, attempt_dir: Path, request: LaunchRequest, node: str,
                     node_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    """What every rank on `node` starts with: the allowlisted part of this
    process's environment, the launch's own, the node's devices (`extra`),
    and what only the node knows (its name, its status folder, the tags its
    processes are found by)."""
    env = rank_environment(request.env)
    if request.checkpoint_uri:
        env.setdefault(contract.CHECKPOINT_URI, request.checkpoint_uri)
    return {
        **env,
        **extra,
        contract.NODE: node,
        contract.STATUS_DIR: str(node_dir / "status"),
        "OMP_NUM_THREADS": "1",
        procs.FLEET_TAG: str(fleet),
        procs.ATTEMPT_TAG: str(attempt_dir),
    }


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 16384) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - max_bytes))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def rank_records(status_dir: Path) -> tuple[dict, ...]:
    records = []
    for path in status_dir.glob(contract.STATUS_GLOB):
        data = read_json(path)
        if isinstance(data, dict):
            records.append(data)
    return tuple(sorted(records, key=lambda r: r.get("rank", 0)))


def observe_node(attempt_dir: Path, entry: dict) -> NodeProcess:
    node_dir = attempt_dir / f"node-{entry['node_rank']}"
    info = read_json(node_dir / "launcher.json") or {}
    running = procs.is_running(info.get("pid", entry.get("pid")), info.get("starttime"))
    ended = read_json(node_dir / "exit.json")
    exit_code = sig = None
    if ended:
        exit_code, sig = ended.get("exit_code"), ended.get("signal")
        running = False
    elif not running:
        sig = signal.SIGKILL.value  # gone without a word: something killed it
    return NodeProcess(
        node=entry["node"], node_rank=entry["node_rank"], running=running,
        exit_code=exit_code, signal=sig, ranks=rank_records(node_dir / "status"),
        log_tail=ended_log(node_dir / "stdout.log") if not running else "",
    )


# An ended node's log is read far enough back to hold the program's own
# error above torchrun's report of it (jobs/recovery/signature.py): a chatty
# peer's traceback and torchrun's summary alone fill forty lines.
ENDED_LOG_LINES, ENDED_LOG_BYTES = 400, 65536


def ended_log(path: Path) -> str:
    return log_tail(path, ENDED_LOG_LINES, ENDED_LOG_BYTES)


def observe(ref: dict) -> AttemptStatus:
    attempt_dir = Path(ref["dir"])
    if not attempt_dir.is_dir():
        return AttemptStatus(state="unknown", message=f"{attempt_dir} is missing")
    nodes = tuple(observe_node(attempt_dir, entry) for entry in ref["nodes"])
    failed = [n for n in nodes if not n.running and (n.signal or (n.exit_code or 0) != 0)]
    if failed:
        first = failed[0]
        how = f"signal {first.signal}" if first.signal else f"exit code {first.exit_code}"
        return AttemptStatus(state="failed", nodes=nodes,
                             message=f"node {first.node} (rank {first.node_rank}) ended by {how}")
    if any(n.running for n in nodes):
        return AttemptStatus(state="running", nodes=nodes)
    return AttemptStatus(state="succeeded", nodes=nodes, message="every node exited 0")


def stop(ref: dict, grace_s: float = 30.0) -> None:
    """SIGTERM every process of the attempt, SIGKILL what is left after grace.

    Hung (SIGSTOPped) ranks cannot act on SIGTERM, so they are killed at once.
    """
    attempt_dir = str(Path(ref["dir"]))
    found = procs.scan(attempt_dir=attempt_dir)
    if not found:
        return
    stopped = [p for p in found if p.state == "T"]
    procs.kill_hard(stopped)
    procs.send([p for p in found if p.state != "T"], signal.SIGTERM)
    # The launchers ignore SIGTERM and end by themselves once torchrun ends.
    left = procs.wait_gone(found, grace_s)
    if left:
        procs.kill_hard(left)
        procs.wait_gone(left, 5.0)
    leftover = procs.scan(attempt_dir=attempt_dir)
    if leftover:
        procs.kill_hard(leftover)
        procs.wait_gone(leftover, 5.0)
