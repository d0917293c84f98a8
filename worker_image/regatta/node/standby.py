"""A node's warm standby on the local fleet: Python started, torch, torchrun's
agent, the SDK and the trainer imported, waiting for the node's next launch.

    python -m regatta.node.standby --dir <fleet>/standby/<node> [--delay S] [--also NODE ...]

Nearly all of a relaunch is start-up: on a cold launch each node starts
torchrun (Python, then `import torch`) and torchrun starts each rank (Python
and `import torch` again) before the gang can meet. A standby pays that
before the failure. The provider keeps one on every ready spare
(`hold_spares`) and, a few seconds after a launch, on each node of the gang,
so that the survivors of a failure restart warm too.

The fleet's nodes share one machine, so its standbys share one import: the
first is started (`ensure`) and forks the others' once its imports are done
(`--also`), and a node that needs one later gets a fork of any ready standby
of the fleet born the same way (`_kin`). A forked standby takes its node's
socket, folder, session and tags (`_settle`), so a kill of the node it was
forked from leaves it alone, as it would a started one.

A launch hands the node's standby its torchrun command line, environment and
node folder over a Unix socket (`hand_over`); the standby answers "ok",
forks its successor (the node's next standby, ready at once with the same
socket and imports), and becomes that node's launcher
(`launcher.supervise`): it forks torchrun's agent from itself, and the agent
forks each rank (`--start-method=fork`), so every process starts with the
imports done. The ranks run the same entry point a cold launch runs (`-m
module` through runpy, or a script path), under the same torchrun agent,
with the same environment and exit codes. Anything
the standby cannot take as it is (another interpreter, a loader path of its
own, no Python at all) it refuses, and the launch goes cold.

The socket's name is abstract (Linux), bound before anything is imported: a
second standby for the same node fails to bind and leaves. The standby ends
by itself once its folder is gone or names another standby, or its fleet's
lease has not been renewed for LEASE_S.

Standard library only at module level: the local provider imports this
module for `ensure` and `hand_over`; torch is imported by the standby
process alone.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from regatta import contract
from regatta.node import procs
from regatta.node.files import read_json, write_json

MODULE = "regatta.node.standby"
INFO = "standby.json"
# The control plane renews the fleet's lease on every cluster pass and every
# launch (`renew_lease`); a standby whose lease has not been renewed this long
# leaves by itself, so none outlives a control plane that went away without
# stopping it (killed, or a test or bench that never said so).
LEASE = "lease"
LEASE_S = 600.0
# Seconds the provider waits for a standby's answer before it kills it and
# launches cold: a standby that took the launch answers at once.
ANSWER_TIMEOUT_S = 5.0
# What a process's loader read when it started: a launch that sets any of
# these differently cannot run in a process that already started.
_FIXED_AT_START = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME")
# What a rank of the built-in trainer imports, done ahead (best effort: a
# missing module only leaves that much of the start-up cold). torch._dynamo
# too: torch's log formatter imports it the first time torchrun's agent logs
# a failed rank, seconds spent between a rank's death and the agent's exit.
PRELOAD = ("torch", "torch.distributed.run", "torch._dynamo", "regatta.run",
           "trainer.__main__", "trainer.trainer")
# A cluster's further imports (the local provider's `standby_imports`: the
# frameworks its programs use, transformers or lightning), named in the
# standby's birth environment so that they are part of its kin (`_kin`).
IMPORTS = contract.STANDBY_IMPORTS
# What a launch may set apart from the standby's birth environment when the
# standby imported modules of the cluster's: Regatta's own names and the
# node's devices (CUDA reads its variables when first used, which a standby
# never does). A module reads its variables as it is imported (Hugging
# Face its HF_* ones), so a launch that sets any other variable differently
# goes cold, where its program's imports see its environment.
_LAUNCH_OWN = ("REGATTA_", "CUDA_")
# A process that initialised CUDA cannot give it to the children it forks:
# their first CUDA call fails ("initialization error"). The standby forks
# every rank, so nothing in it may touch CUDA; `torch.cuda.is_available()`
# (cuInit) under this variable asks NVML instead, which forks safely.
# Only the standby's own environment: a launch replaces it.
NO_CUDA_INIT = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def standby_dir(fleet: Path, node: str) -> Path:
    return Path(fleet) / "standby" / node


def address(folder: Path) -> str:
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:32]
    return f"\0regatta-standby-{digest}"


@functools.cache
def unavailable() -> str:
    """Why this machine cannot hold standbys ("" when it can): they are
    reached over abstract Unix sockets, which a sandbox's kernel may lack.
    Without them every launch goes cold."""
    name = f"\0regatta-standby-probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server, \
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            server.bind(name)
            server.listen(1)
            client.settimeout(2.0)
            client.connect(name)
    except OSError as exc:
        return f"abstract Unix sockets do not work here ({exc})"
    return ""


def cuda_driver_loaded(maps: str) -> str:
    """The CUDA driver library mapped into a process (its /proc/<pid>/maps),
    "" if none: loaded means CUDA was initialised there."""
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcuda.so" in path:
            return path
    return ""


def _cuda_in_me() -> str:
    try:
        with open("/proc/self/maps") as fh:
            return cuda_driver_loaded(fh.read())
    except OSError:
        return ""


def _info(folder: Path) -> dict:
    return read_json(folder / INFO, {})


def state(fleet: Path, node: str) -> str:
    """A node's standby as its own record says: "starting", "ready",
    "unavailable", or "" (none started)."""
    return _info(standby_dir(fleet, node)).get("state", "")


def _alive(info: dict) -> bool:
    return procs.is_running(info.get("pid"), info.get("starttime"))


# --- the provider's side ---------------------------------------------------------

def renew_lease(fleet: Path) -> None:
    path = Path(fleet) / "standby" / LEASE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def _lease_expired(folder: Path) -> bool:
    try:
        return time.time() - (folder.parent / LEASE).stat().st_mtime > LEASE_S
    except OSError:
        return True


def _kin(env: dict) -> str:
    """What the standbys of one fleet share: their birth environment less the
    node's name (a digest). A standby forks another node's for its kin only,
    so a forked standby is born as a started one would be."""
    rest = {k: str(v) for k, v in env.items() if k != procs.NODE_TAG}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]


def _living(fleet: Path) -> dict[str, dict]:
    """The fleet's live standbys' records, by node."""
    found = {}
    with contextlib.suppress(OSError):
        for folder in (Path(fleet) / "standby").iterdir():
            info = _info(folder) if folder.is_dir() else {}
            if info and _alive(info):
                found[folder.name] = info
    return found


def ensure(fleet: Path, nodes: list[str], python: str, env: dict, delay_s: float = 0.0) -> None:
    """Start a standby on each of `nodes` that has none, with one torch import
    for all of them: forked from a ready standby of the fleet born the same
    way (`_kin`), else from one started on the first node, which forks the
    others' once its imports are done (after `delay_s`). `env` is the birth
    environment; it carries the fleet's and the node's tags, so a node kill
    takes its standby along. Returns once the standbys are forked, or the one
    started has detached."""
    renew_lease(fleet)  # never started into a lease about to lapse
    if unavailable():
        return
    birth = {**env, procs.FLEET_TAG: str(fleet)}
    kin = _kin(birth)
    living = _living(fleet)
    coming = {n for info in living.values() if info.get("state") == "starting"
              and info.get("kin") == kin and info.get("python") == python
              for n in info.get("also", ())}
    wanted = [n for n in dict.fromkeys(nodes) if n not in living and n not in coming]
    if not wanted:
        return
    for node, info in living.items():
        if (info.get("state") == "ready" and info.get("kin") == kin
                and info.get("python") == python
                and _ask(standby_dir(fleet, node), {"spawn": wanted})[0] == b"ok"):
            return
    first, others = wanted[0], wanted[1:]
    folder = standby_dir(fleet, first)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "standby.err", "ab") as err:
        started = subprocess.Popen(
            [python, "-m", MODULE, "--dir", str(folder), "--delay", str(delay_s),
             *(["--also", *others] if others else [])],
            env={**birth, procs.NODE_TAG: first}, cwd=folder,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )
    started.wait(timeout=15)


def _ask(folder: Path, task: dict) -> tuple[bytes, int]:
    """Send the standby in `folder` a task: its answer ("ok", or "no: why";
    b"" if none came) and its pid (0 if it could not be reached)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(ANSWER_TIMEOUT_S)
        try:
            sock.connect(address(folder))
            peer, _, _ = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError:
            return b"", 0  # not listening: gone, or still importing
        try:
            sock.sendall(json.dumps(task).encode())
            sock.shutdown(socket.SHUT_WR)
            return sock.recv(64), peer
        except OSError:
            return b"", peer


def hand_over(fleet: Path, node: str, node_dir: Path, argv: list[str], env: dict,
              python: str) -> bool:
    """Give the node's launch to its standby: True once the standby took it
    (it then writes `launcher.json` as a cold launcher does), False if there
    is none ready or it refused (the caller launches cold)."""
    folder = standby_dir(fleet, node)
    info = _info(folder)
    if info.get("state") != "ready" or info.get("python") != python or not _alive(info):
        return False
    answer, peer = _ask(folder, {"node_dir": str(node_dir), "argv": argv, "env": env})
    if answer == b"ok":
        return True
    if not answer and peer > 0:
        # It may have gone on without a word: it must not run beside the
        # cold launch that follows.
        procs.kill_hard([p for p in procs.scan(fleet=str(fleet), node=node) if p.pid == peer])
    return False


def stop_idle(fleet: Path) -> list[int]:
    """Kill the fleet's standbys that hold no launch (Regatta stopping: a
    standby is detached, so nothing else ends it)."""
    idle = [p for p in procs.scan(fleet=str(fleet)) if procs.ATTEMPT_TAG not in p.env]
    killed = procs.kill_hard(idle)
    procs.wait_gone(idle, 5.0)
    return killed


# --- the standby's side ----------------------------------------------------------

def further_imports(env: dict) -> list[str]:
    """The cluster's further modules named in a birth environment."""
    return [name for name in env.get(IMPORTS, "").replace(" ", "").split(",") if name]


def _preload() -> list[str]:
    import importlib

    done = []
    for name in (*PRELOAD, *further_imports(_BIRTH)):
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:  # noqa: BLE001 - what fails to import is imported cold, or fails there
            pass
    return done


def _refusal(task: dict) -> str:
    argv, env = task.get("argv"), task.get("env")
    if not isinstance(argv, list) or not isinstance(env, dict) or not task.get("node_dir"):
        return "malformed"
    if argv[:3] != [sys.executable, "-m", "torch.distributed.run"]:
        return "not this interpreter's torchrun"
    for name in _FIXED_AT_START:
        if env.get(name) != os.environ.get(name):
            return f"{name} differs"
    if _CUDA_LOADED and env.get("CUDA_VISIBLE_DEVICES") != "":
        return f"CUDA was initialised here ({_CUDA_LOADED}): forked ranks could not use it"
    if further_imports(_BIRTH):
        for name in sorted(set(env) | set(_BIRTH)):
            if not name.startswith(_LAUNCH_OWN) and env.get(name) != _BIRTH.get(name):
                return f"{name} differs from the environment {_BIRTH[IMPORTS]} were imported in"
    return ""


_CUDA_LOADED = ""  # set once the imports are done (`serve`)


def _receive(conn: socket.socket) -> dict:
    conn.settimeout(ANSWER_TIMEOUT_S)
    chunks, size = [], 0
    while chunk := conn.recv(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > 4 << 20:
            return {}
    try:
        task = json.loads(b"".join(chunks))
    except ValueError:
        return {}
    return task if isinstance(task, dict) else {}


def _wait_for_launch(sock: socket.socket, folder: Path
                     ) -> dict | tuple[Path, socket.socket] | None:
    """The next launch handed over (its task), None once this standby should
    leave, or in a standby forked for another node (`_fork_kin`), that
    node's folder and socket."""
    me = os.getpid()
    sock.settimeout(1.0)
    while True:
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            mine = _info(folder).get("pid") == me
            if mine and not _lease_expired(folder):
                continue
            if mine:  # no control plane has asked for standbys in LEASE_S
                (folder / INFO).unlink(missing_ok=True)
            return None  # else the folder is gone, or another standby took it over
        with conn:
            try:
                task = _receive(conn)
                if "spawn" in task:
                    kin = _fork_kin(sock, folder, task["spawn"])
                    if kin:
                        return kin  # in a new standby, another node's now
                    conn.sendall(b"ok")
                    continue
                refusal = _refusal(task)
                if refusal:
                    conn.sendall(f"no: {refusal}".encode()[:64])
                    continue
                # Off the books before answering: from "ok" on this process
                # is the node's launcher, and the provider may start the
                # node's next standby at once. Tagged with the attempt
                # before it too: from "ok" on, a stop of the attempt must
                # find this process among its own, and a stop of the idle
                # standbys must not count it among them.
                procs.tag_self(task["env"])
                (folder / INFO).unlink(missing_ok=True)
                conn.sendall(b"ok")
            except OSError:
                return None  # the provider gave up on us and launches cold
            return task


def _fork_kin(own: socket.socket, folder: Path, nodes: object) -> tuple[Path, socket.socket] | None:
    """Fork a standby for each of `nodes` (the same fleet's) from this one,
    imports done: os.fork's contract, for a whole list. Here it returns None
    once each new standby has bound its node's socket and tagged itself as
    that node's (or left: one holds the node already); in each new standby,
    its node's folder and bound socket."""
    for node in nodes if isinstance(nodes, list) else ():
        if not isinstance(node, str) or node in ("", ".", "..") or Path(node).name != node:
            continue
        settled_r, settled_w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(settled_r)
            if os.fork():
                os._exit(0)  # forked twice: nobody's child to reap
            own.close()  # or the node this one serves could not get another standby
            return _settle(folder, folder.parent / node, settled_w)
        os.close(settled_w)
        os.waitpid(child, 0)
        with os.fdopen(settled_r, "rb") as settled:
            settled.read()  # at EOF: bound and tagged, or gone
    return None


def _settle(donor: Path, folder: Path, settled_w: int) -> tuple[Path, socket.socket]:
    """Make a freshly forked process the standby of `folder`'s node: what a
    standby started there would have (its own session, socket, tags, folder
    and error log); its birth environment stays the donor's, which differs
    only in the node's name (`_kin`)."""
    os.setsid()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address(folder))
    except OSError:
        os._exit(0)  # another standby holds this node
    os.environ[procs.NODE_TAG] = folder.name
    procs.tag_self()  # the node's from now on, as a scan sees it (`procs.scan`)
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    err = os.open(folder / "standby.err", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(err, 2)
    os.close(err)
    write_json(folder / INFO, {**_about(), "state": "starting", "forked_from": donor.name})
    sock.listen(4)
    os.close(settled_w)
    return folder, sock


def run_module(module: str, *args: str) -> None:
    """A rank's entry point for `torchrun -m module`, in a forked rank."""
    import runpy

    _become_rank(first_on_path=os.getcwd())  # as `python -m` puts it
    sys.argv = [module, *args]
    with _uncaught_as_main():
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def run_script(script: str, *args: str) -> None:
    """A rank's entry point for `torchrun script.py`, in a forked rank."""
    import runpy

    _become_rank(first_on_path=os.path.dirname(os.path.abspath(script)))
    sys.argv = [script, *args]
    with _uncaught_as_main():
        runpy.run_path(script, run_name="__main__")


@contextlib.contextmanager
def _uncaught_as_main():
    """An exception the program does not catch goes to `sys.excepthook`, then
    exits 1, as in a `python` a cold torchrun starts. torch's process wrapper
    would catch it first and exit 1 without the hook, and the SDK's hook is
    where a rank reports its crash and a survivor hands over its step."""
    try:
        yield
    except Exception:  # noqa: BLE001 - handed to the hook, as the interpreter would
        sys.excepthook(*sys.exc_info())
        raise SystemExit(1) from None


def _become_rank(first_on_path: str) -> None:
    # The agent's handlers (which raise in the agent) are inherited through
    # fork; a rank starts with the defaults, as a freshly exec'd one does.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs.tag_self()
    _mark_started()
    # `python -u`, as a cold launch runs its ranks: lines reach the log as written.
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    # sys.path as a cold rank's interpreter builds it: the program's own
    # folder first, then PYTHONPATH, and not what the standby's own start
    # put first (`-m`: the standby's folder, its working directory then).
    sys.path[:] = [p for p in sys.path if p != _STARTED_IN]
    for entry in reversed([first_on_path, *(
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable()


def _mark_started() -> None:
    """The rank's first start-up marker (the SDK writes the later ones):
    forked, running the program's entry point."""
    from regatta import startup

    startup.mark("started", warm=True)


def _count_exit_zero_as_done() -> None:
    """torch's context for ranks started as a function counts a rank done
    once it returned a value; a rank that ends with `os._exit(0)`, as the
    SDK and the trainer end (regatta.run._exit), never does, and the agent
    would wait forever. A cold launch's ranks are judged by exit code alone:
    so are these. Patched in the standby's own agent process only."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    poll = MultiprocessContext._poll

    def _poll(self):
        for local_rank, process in enumerate(getattr(self._pc, "processes", None) or ()):
            if process.exitcode == 0:
                self._return_values.setdefault(local_rank, None)
        return poll(self)

    MultiprocessContext._poll = _poll


def _config_without_cuda(torchrun, args):
    """torchrun's `config_from_args`, with its CUDA question answered by
    NVML. Its LaunchConfig asks `torch.cuda.is_available()` and
    `device_count()` (for a default NUMA binding: none in torch's own
    builds), and here that would initialise CUDA (cuInit) in the process
    the ranks are then forked from: on a GPU each forked rank's first CUDA
    call would fail. NVML counts the same GPUs without; where it cannot,
    the answer is none, and the ranks run unbound."""
    import torch

    count = getattr(torch.cuda, "_device_count_nvml", lambda: -1)()
    count = max(0, count)
    asked = torch.cuda.is_available, torch.cuda.device_count
    torch.cuda.is_available, torch.cuda.device_count = (lambda: count > 0), (lambda: count)
    try:
        return torchrun.config_from_args(args)
    finally:
        torch.cuda.is_available, torch.cuda.device_count = asked


def _agent(torchrun_args: list[str]) -> int:
    """torchrun's `run`, in this process, with ranks forked from it."""
    import traceback

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    _count_exit_zero_as_done()

    args = torchrun.parse_args(["--start-method=fork", *torchrun_args])
    config, cmd, cmd_args = _config_without_cuda(torchrun, args)
    entry, call = cmd, list(cmd_args)
    if isinstance(cmd, str) and cmd_args[:1] == ["-u"]:
        if cmd_args[1:2] == ["-m"]:
            entry, call = run_module, cmd_args[2:]
        else:
            entry, call = run_script, cmd_args[1:]
    try:
        elastic_launch(config=config, entrypoint=entry)(*call)
    except ChildFailedError:
        traceback.print_exc()  # "Root Cause ... exitcode", as torchrun prints it
        return 1
    return 0


def _launch(task: dict, about: dict) -> int:
    from regatta.node import launcher

    node_dir = Path(task["node_dir"])
    os.environ.clear()
    os.environ.update({k: str(v) for k, v in task["env"].items()})
    os.chdir(node_dir)  # tagged with the attempt already (`_wait_for_launch`)
    launcher.ignore_stop_signals()
    out = os.open(node_dir / "stdout.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            procs.tag_self()
            code = _agent(task["argv"][3:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported in the node's log, as torchrun's would be
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(out)
    code = launcher.supervise(node_dir, launcher.Forked(pid), task.get("beat_every"),
                              warm=True, standby=about)
    procs.prune_tags(os.environ.get(procs.FLEET_TAG, ""))
    procs.untag_self()
    return code


def serve(folder: Path, delay_s: float, also: list[str]) -> int:
    if os.fork():
        os._exit(0)  # the provider returns at once; the standby goes on alone
    global _CUDA_LOADED
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address(folder))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            # Not another standby: this machine cannot have one. Said where
            # `ensure` looks, so it stops starting standbys that cannot bind.
            write_json(folder / INFO, {**_about(), "state": "unavailable",
                                            "error": f"binding its socket: {exc}"})
            return 1
        return 0  # another standby holds this node
    me = os.getpid()
    born = time.time()
    # `also`: the nodes whose standbys this one forks once ready, which
    # `ensure` leaves to it meanwhile.
    write_json(folder / INFO, {**_about(), "state": "starting", "also": also})
    time.sleep(delay_s)
    if _info(folder).get("pid") != me:
        return 0
    os.environ.update(NO_CUDA_INIT)
    preloaded = _preload()
    _CUDA_LOADED = _cuda_in_me()
    sock.listen(4)
    forked_from = ""  # the node whose standby this one was forked from, if any
    kin = _fork_kin(sock, folder, also)
    if kin:
        forked_from, (folder, sock) = folder.name, kin
        born = time.time()
    while True:
        ready_at = time.time()
        write_json(folder / INFO, {**_about(), "state": "ready", "ready_at": ready_at,
                                        "preloaded": preloaded, "cuda_loaded": _CUDA_LOADED,
                                        **({"forked_from": forked_from} if forked_from else {})})
        task = _wait_for_launch(sock, folder)
        if task is None:
            sock.close()
            return 0
        if isinstance(task, tuple):  # forked for another node: serve it from now on
            forked_from, (folder, sock) = folder.name, task
            born = time.time()
            continue
        # The node's next standby is a fork of this one, made before the
        # launch changes anything here: ready at once, with the socket and
        # the imports, so a second failure soon after the first restarts
        # warm too. Forked twice, so that it is nobody's child to reap.
        successor = os.fork()
        if successor == 0:
            if os.fork():
                os._exit(0)
            # Not the attempt's (this process tagged itself with it), and
            # the node's though its birth environment names the node of
            # the standby it was forked from (`_settle`).
            procs.tag_self()
            forked_from = folder.name
            continue
        os.waitpid(successor, 0)
        sock.close()
        return _launch(task, {"pid": os.getpid(), "born_at": born, "ready_at": ready_at,
                              "preloaded": preloaded, "cuda_loaded": _CUDA_LOADED})


def _about() -> dict:
    me = os.getpid()
    return {"pid": me, "starttime": procs.starttime(me), "python": sys.executable,
            "kin": _KIN}


# Its birth environment, and that less the node's name (`_kin`), taken
# before the standby changes anything in it.
_BIRTH: dict[str, str] = {}
_KIN = ""


# The entry the interpreter put first on sys.path as the standby started
# (`main`), which a cold rank's interpreter would not have.
_STARTED_IN: str | None = None


def main(argv: list[str]) -> int:
    global _STARTED_IN, _BIRTH, _KIN
    _STARTED_IN = sys.path[0] if sys.path else None
    _BIRTH = dict(os.environ)
    _KIN = _kin(_BIRTH)
    parser = argparse.ArgumentParser(prog="standby")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--also", nargs="*", default=[], help="other nodes' standbys to fork")
    opts = parser.parse_args(argv)
    return serve(opts.dir, opts.delay, opts.also)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
