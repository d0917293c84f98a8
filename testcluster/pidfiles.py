"""Pid files of the daemons a state folder started, shared by testcluster/
and slurmcluster/: one file per daemon, `<pid>\\n<binary>\\n`, written whole
by rename, so a `status` or `down` from another process never reads half."""

from __future__ import annotations

from pathlib import Path


def record(pids: Path, name: str, pid: int, binary: str) -> None:
    pidfile = pids / f"{name}.pid"
    tmp = pidfile.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n{binary}\n")
    tmp.rename(pidfile)


def running(pids: Path) -> dict[str, int]:
    """Live daemons recorded in `pids`. A pid counts only while it still
    runs the binary it was started with: after a reboot or a crash the
    number may belong to some other process, which `down` must never signal."""
    alive = {}
    if not pids.exists():
        return alive
    for pidfile in sorted(pids.glob("*.pid")):
        pid_text, _, binary = pidfile.read_text().partition("\n")
        try:
            argv0 = Path(f"/proc/{int(pid_text)}/cmdline").read_bytes().split(b"\0")[0]
        except (OSError, ValueError):
            continue
        if argv0.decode(errors="replace") == binary.strip():
            alive[pidfile.stem] = int(pid_text)
    return alive
