"""The local fleet's worker environment: torch and the trainer, which its
ranks import and the control plane does not.

`./run` starts the control plane first and installs this environment behind
it (`make fleet-env`), so the web answers in seconds while some 2.6 GB of
torch arrive. While it installs, the fleet cannot run ranks: the admission
pass keeps the cluster's jobs queued with `waiting_reason` ("installing the
fleet's torch: 1.2 / 2.6 GB"), standbys are not started, and the fleet page
shows the same line. The installer (`Installer`, run by regatta_up) writes
its progress to `status_path()`; with no such file the environment is what
the fleet's Python has (a `make install` virtualenv has everything).

Progress comes from uv's own download bars, read through a pseudo-terminal
(uv draws them only on a terminal): each package's bytes done and total.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

INSTALLING, READY, FAILED = "installing", "ready", "failed"
STATUS_FILE = "worker-env.json"

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
          "kB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}
# One package's bar as uv draws it: "torch  ----------  120.3 MiB/899.7 MiB".
_BAR = re.compile(r"(?P<name>[A-Za-z0-9][\w.\-]*)\s+[-━─=#>]*\s+(?P<done>[\d.]+) (?P<du>[KMG]?i?B)"
                  r"/(?P<total>[\d.]+) (?P<tu>[KMG]?i?B)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_MOVES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def status_path() -> Path:
    return Path(settings.LOCAL_FLEET_DIR) / STATUS_FILE


def read_status(path: Path | None = None) -> dict:
    try:
        return json.loads((path or status_path()).read_text())
    except (OSError, ValueError):
        return {}


def gb(n: float) -> str:
    return f"{n / 1e9:.1f}"


def describe(status: dict) -> str:
    """The line a person reads: on the fleet page, in a job's pending reason,
    on the console."""
    state = status.get("state")
    if state == INSTALLING:
        done, total = status.get("done_bytes") or 0, status.get("total_bytes") or 0
        if status.get("phase") == "linking":
            return "installing the fleet's torch: unpacking into the virtualenv"
        if total:
            return f"installing the fleet's torch: {gb(done)} / {gb(total)} GB"
        return "installing the fleet's torch: resolving packages"
    if state == FAILED:
        return (f"the fleet's torch did not install ({status.get('error', 'see the log')}); "
                f"log: {status.get('log', '')}")
    return ""


def waiting_reason(python: str) -> str:
    """Why the fleet cannot run ranks yet, or "" when it can."""
    status = read_status()
    if status.get("state") in (INSTALLING, FAILED):
        return describe(status)
    if not status and python == sys.executable and not _has_torch():
        return "the fleet's Python has no torch: run `make fleet-env` (or `make install`)"
    return ""


def _has_torch() -> bool:
    # The installer may have added it since this process started.
    importlib.invalidate_caches()
    return importlib.util.find_spec("torch") is not None


@dataclass
class Progress:
    """Bytes per package as uv reports them; a package whose bar went away
    is done."""

    packages: dict[str, list[float]] = field(default_factory=dict)
    linking: bool = False

    pending: str = ""

    def feed(self, text: str) -> None:
        """Read what uv drew; a frame cut short is kept for the next call."""
        text = _MOVES.sub("\n", _COLOUR.sub("", self.pending + text))
        text, _, self.pending = text.rpartition("\n")
        self.pending = self.pending[-4096:]
        for m in _BAR.finditer(text):
            done = float(m["done"]) * _UNITS.get(m["du"], 1)
            total = float(m["total"]) * _UNITS.get(m["tu"], 1)
            if total > 0:
                self.packages[m["name"]] = [min(done, total), total]
        if "Installing wheels" in text or "Prepared " in text:
            self.linking = True
            for entry in self.packages.values():
                entry[0] = entry[1]

    @property
    def done(self) -> float:
        return sum(d for d, _ in self.packages.values())

    @property
    def total(self) -> float:
        return sum(t for _, t in self.packages.values())


class Installer:
    """Runs `argv` (the Makefile's fleet-env target) in a pseudo-terminal,
    keeps the status file current, writes everything it prints to `log`,
    and calls `say` with a progress line now and then."""

    def __init__(self, argv: list[str], log: Path, say: Callable[[str], None],
                 path: Path | None = None, every_s: float = 10.0):
        self.argv, self.log, self.say = argv, log, say
        self.path = path or status_path()
        self.every_s = every_s
        self.pid: int | None = None

    def write(self, **status) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({**status, "log": str(self.log), "at": time.time()}))
        os.replace(tmp, self.path)

    def run(self) -> bool:
        started = time.monotonic()
        progress = Progress()
        self.write(state=INSTALLING, done_bytes=0, total_bytes=0)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        pid, fd = pty.fork()
        if pid == 0:  # the child: uv draws its bars for a wide terminal
            os.environ.update(COLUMNS="160", LINES="60")
            try:
                os.execvp(self.argv[0], self.argv)
            finally:
                os._exit(127)
        self.pid = pid
        said = 0.0
        with open(self.log, "ab") as log:
            while True:
                ready, _, _ = select.select([fd], [], [], 1.0)
                if ready:
                    try:
                        chunk = os.read(fd, 65536)
                    except OSError:  # the child closed its terminal
                        chunk = b""
                    if not chunk:
                        break
                    log.write(chunk)
                    progress.feed(chunk.decode(errors="replace"))
                status = {"state": INSTALLING, "done_bytes": int(progress.done),
                          "total_bytes": int(progress.total),
                          "phase": "linking" if progress.linking else "downloading"}
                self.write(**status)
                if time.monotonic() - said >= self.every_s and progress.total:
                    said = time.monotonic()
                    self.say(describe(status))
        os.close(fd)
        _, code = os.waitpid(pid, 0)
        self.pid = None
        ok = os.waitstatus_to_exitcode(code) == 0
        seconds = time.monotonic() - started
        if ok:
            self.write(state=READY, done_bytes=int(progress.total),
                       total_bytes=int(progress.total), seconds=round(seconds, 1))
        else:
            self.write(state=FAILED, error=f"exit status {os.waitstatus_to_exitcode(code)}",
                       seconds=round(seconds, 1))
        return ok

    def stop(self) -> None:
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGTERM)  # pty.fork made it a session leader
            except (ProcessLookupError, PermissionError):
                pass


def fleet_env_argv() -> list[str]:
    """The Makefile's target for the fleet's environment, in the project's folder."""
    return ["make", "--no-print-directory", "-C", str(settings.BASE_DIR), "fleet-env",
            f"VENV={Path(sys.prefix)}"]


