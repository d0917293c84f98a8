"""Finding and signalling the processes of the local fleet through /proc.

Every process an attempt starts carries tags in its environment
(`REGATTA_LOCAL_FLEET`, `REGATTA_LOCAL_ATTEMPT_DIR`, `REGATTA_NODE`), and
children inherit them. torchrun puts each rank in a session of its own and a
killed torchrun leaves its ranks to init, so neither process groups nor the
parent tree find every rank; the tags do, from any process, after any restart.

A node's warm standby (standby.py) is born before it knows its attempt or
its ranks, and /proc/<pid>/environ shows only the environment a process was
born with. So a process born with the fleet's tag may add tags later
(`tag_self`): a file `<fleet>/tags/<pid>.json`, read with its start time so
that a reused pid never inherits them.

Standard library and the worker contract only: the node's launcher and
standby import it before anything else, and so does the control plane.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from dataclasses import dataclass, field

from regatta import contract

PROC = "/proc"
FLEET_TAG = contract.LOCAL_FLEET
ATTEMPT_TAG = contract.LOCAL_ATTEMPT_DIR
NODE_TAG = contract.NODE
_WANTED = (FLEET_TAG, ATTEMPT_TAG, NODE_TAG, contract.RANK, contract.LOCAL_RANK)
TAGS_DIR = "tags"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str  # R, S, D, T (stopped), Z (zombie), ...
    starttime: int  # clock ticks since boot; tells a reused pid apart
    env: dict = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        value = self.env.get(contract.RANK)
        return int(value) if value is not None and value.isdigit() else None


def stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, starttime) of a live or zombie pid, None if gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    # The command name sits in parentheses and may itself hold spaces or ')'.
    rest = raw[raw.rindex(")") + 2:].split()
    return int(rest[1]), rest[0], int(rest[19])


@functools.cache
def unreadable() -> str:
    """Why this system's /proc cannot show the fleet its processes ("" when
    it can). Everything here finds ranks by the tags in
    /proc/<pid>/environ and tells a reused pid by /proc/<pid>/stat; a
    sandbox's /proc (gVisor's, say) may lack either, and then a kill, a
    stop or a drain would find nothing to signal."""
    me = os.getpid()
    try:
        with open(f"{PROC}/{me}/environ", "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        return f"{PROC}/<pid>/environ cannot be read ({exc})"
    if os.environ and b"=" not in raw:
        return f"{PROC}/<pid>/environ shows no environment"
    if starttime(me) is None:
        return f"{PROC}/<pid>/stat cannot be read"
    return ""


def usage(pid: int) -> tuple[float, float] | None:
    """(CPU seconds used, seconds since it started) of a live pid, None if
    gone: a process that burns CPU is working (importing, compiling); one
    that does not is waiting (a rendezvous, a peer)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            rest = fh.read().decode(errors="replace")
        with open(f"{PROC}/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    fields = rest[rest.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return round(cpu, 2), round(max(0.0, uptime - int(fields[19]) / ticks), 1)


def starttime(pid: int) -> int | None:
    info = stat(pid)
    return info[2] if info else None


def is_running(pid: int | None, start: int | None = None) -> bool:
    """True while `pid` exists, is not a zombie, and (if given) began at `start`."""
    if not pid:
        return False
    info = stat(pid)
    if info is None or info[1] in ("Z", "X"):
        return False
    return start is None or info[2] == start


def _environ(pid: int) -> dict:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in _WANTED:
            env[key.decode()] = value.decode(errors="replace")
    return env


def _tags_file(fleet: str, pid: int) -> str:
    return os.path.join(fleet, TAGS_DIR, f"{pid}.json")


def tag_self(env: dict | None = None) -> None:
    """Record this process's tags from `env` (default: its environment now),
    for a process whose birth environment lacks them. Needs the fleet tag."""
    env = os.environ if env is None else env
    fleet = env.get(FLEET_TAG)
    if not fleet:
        return
    me = os.getpid()
    path = _tags_file(fleet, me)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{me}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"starttime": starttime(me), "env": {k: env[k] for k in _WANTED if k in env}},
                  fh)
    os.replace(tmp, path)


def untag_self() -> None:
    fleet = os.environ.get(FLEET_TAG)
    if fleet:
        try:
            os.unlink(_tags_file(fleet, os.getpid()))
        except OSError:
            pass


def _added_tags(fleet: str | None, pid: int, start: int) -> dict:
    if not fleet:
        return {}
    try:
        with open(_tags_file(fleet, pid)) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("starttime") != start:
        return {}
    return {k: str(v) for k, v in (data.get("env") or {}).items() if k in _WANTED}


def prune_tags(fleet: str) -> None:
    """Remove the tag files of processes that have ended."""
    try:
        names = os.listdir(os.path.join(fleet, TAGS_DIR))
    except OSError:
        return
    for name in names:
        pid = name.removesuffix(".json")
        if not pid.isdigit():
            continue
        if not is_running(int(pid)):
            try:
                os.unlink(os.path.join(fleet, TAGS_DIR, name))
            except OSError:
                pass


def scan(**tags: str) -> list[Proc]:
    """Live processes whose environment holds every `tag=value` given
    (keys: fleet, attempt_dir, node)."""
    names = {"fleet": FLEET_TAG, "attempt_dir": ATTEMPT_TAG, "node": NODE_TAG}
    wanted = {names[k]: str(v) for k, v in tags.items()}
    me = os.getpid()
    found = []
    for entry in os.listdir(PROC):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        env = _environ(pid)
        if not env:
            continue
        info = stat(pid)
        if info is None or info[1] in ("Z", "X"):
            continue
        env.update(_added_tags(env.get(FLEET_TAG), pid, info[2]))
        if any(env.get(k) != v for k, v in wanted.items()):
            continue
        found.append(Proc(pid=pid, ppid=info[0], state=info[1], starttime=info[2], env=env))
    return found


def top_ranks(procs: list[Proc]) -> list[Proc]:
    """The rank processes torchrun started, not their own children."""
    by_pid = {p.pid: p for p in procs}
    return [
        p for p in procs
        if p.rank is not None and (p.ppid not in by_pid or by_pid[p.ppid].rank is None)
    ]


def send(procs: list[Proc], sig: int) -> list[int]:
    """Signal each process that is still the one we found; return who got it."""
    sent = []
    for p in procs:
        if starttime(p.pid) != p.starttime:
            continue
        try:
            os.kill(p.pid, sig)
            sent.append(p.pid)
        except ProcessLookupError:
            pass
    return sent


def kill_hard(procs: list[Proc]) -> list[int]:
    """SIGKILL, stopping everyone first so that no survivor reacts to the others'
    deaths half-way; a SIGSTOPped (hung) process dies on SIGKILL as well."""
    send(procs, signal.SIGSTOP)
    killed = send(procs, signal.SIGKILL)
    send(procs, signal.SIGCONT)
    return killed


def wait_gone(procs: list[Proc], timeout: float, interval: float = 0.1) -> list[Proc]:
    """Wait up to `timeout` for the processes to end; return those still running."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in procs if is_running(p.pid, p.starttime)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval)
