"""The per-node wrapper around torchrun: the local fleet runs it detached,
a Slurm job step in the foreground, each on the node with the worker's Python.

    python -m regatta.node.launcher run [--foreground] [--beat-every S] \\
        --dir <attempt>/node-<i> -- <torchrun argv...>
    python -m regatta.node.launcher kill-after --seconds S --fleet F --node N

`run` forks away from its parent (so the worker that launched it can exit or
restart), records its own pid and torchrun's in `launcher.json`, waits for
torchrun, and writes how it ended to `exit.json`. `--foreground` stays in
its parent's process instead: a Slurm job step (clusters/providers/slurm/)
lasts as long as its task, and Slurm tracks and signals the step's
processes. `--beat-every` rewrites `beat.json` every S seconds while
torchrun runs: a node whose beat stops with no `exit.json` lost its
launcher along with its ranks (Slurm's observe reads it). torchrun itself only says
"1" when a rank fails, so the rank's own exit code or signal is read back from
torchrun's failure report ("Root Cause ... exitcode : 83"). A node with a
`launcher.json` but neither a live launcher nor an `exit.json` was killed.

`kill-after` is the deadline of a drain: it SIGKILLs the node's ranks that are
still alive after the grace period, without holding up the caller.

Standard library only (and this package's stdlib-only modules): this runs
before anything else is imported.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from regatta.node import procs
from regatta.node.files import write_json

MODULE = "regatta.node.launcher"
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?exitcode\s*:\s*(-?\d+)",
                         re.DOTALL)


def command(python: str, *args: str) -> list[str]:
    """The argv that runs this launcher with `python` (the node's)."""
    return [python, "-m", MODULE, *args]


def rank_exitcode(log: Path) -> int | None:
    """The failing rank's exit code from torchrun's report (negative: a signal)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    found = _ROOT_CAUSE.findall(text)
    return int(found[-1]) if found else None


def outcome(returncode: int, log: Path) -> dict:
    result = {"torchrun_returncode": returncode, "exit_code": None, "signal": None}
    if returncode < 0:
        result["signal"] = -returncode
        return result
    rank_code = rank_exitcode(log) if returncode != 0 else None
    if rank_code is not None and rank_code < 0:
        result["signal"] = -rank_code
    elif rank_code is not None:
        result["exit_code"] = rank_code
    else:
        result["exit_code"] = returncode
    return result


def run(node_dir: Path, argv: list[str], foreground: bool = False,
        beat_every: float | None = None) -> int:
    if not foreground and os.fork():
        os._exit(0)  # the launching process returns at once; we go on alone
    ignore_stop_signals()
    with open(node_dir / "stdout.log", "ab") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, cwd=node_dir)
    return supervise(node_dir, child, beat_every)


def ignore_stop_signals() -> None:
    """The provider signals the whole session on stop; the launcher outlives
    torchrun on purpose, to write down how it ended."""
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)


class Forked:
    """A child this process forked, waited on the way `Popen.wait` waits
    (a negative return code: the signal that ended it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)


def supervise(node_dir: Path, child, beat_every: float | None = None, **about) -> int:
    """Record the launcher and its torchrun (`child`: a Popen or `Forked`),
    beat while it runs, and write how it ended to `exit.json`."""
    me = os.getpid()
    write_json(node_dir / "launcher.json", {
        "pid": me, "pgid": os.getpgid(0), "starttime": procs.starttime(me),
        "torchrun_pid": child.pid, "torchrun_starttime": procs.starttime(child.pid),
        "started_at": time.time(), **about,
    })
    while True:
        if beat_every:
            write_json(node_dir / "beat.json", {"at": time.time()})
        try:
            returncode = child.wait(timeout=beat_every)
            break
        except (InterruptedError, subprocess.TimeoutExpired):
            continue
    result = outcome(returncode, node_dir / "stdout.log")
    result["ended_at"] = time.time()
    write_json(node_dir / "exit.json", result)
    if result["signal"]:
        return 128 + result["signal"]
    return result["exit_code"] & 0xFF


def kill_after(seconds: float, fleet: str, node: str) -> int:
    if os.fork():
        os._exit(0)
    targets = procs.top_ranks(procs.scan(fleet=fleet, node=node))
    left = procs.wait_gone(targets, seconds, interval=0.25)
    procs.kill_hard(left)
    return 0


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launcher")
    sub = parser.add_subparsers(dest="mode", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--dir", required=True, type=Path)
    p_run.add_argument("--foreground", action="store_true")
    p_run.add_argument("--beat-every", type=float, default=None)
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    p_kill = sub.add_parser("kill-after")
    p_kill.add_argument("--seconds", required=True, type=float)
    p_kill.add_argument("--fleet", required=True)
    p_kill.add_argument("--node", required=True)
    opts = parser.parse_args(args)
    if opts.mode == "run":
        argv = opts.argv[1:] if opts.argv[:1] == ["--"] else opts.argv
        return run(opts.dir, argv, foreground=opts.foreground, beat_every=opts.beat_every)
    return kill_after(opts.seconds, opts.fleet, opts.node)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
