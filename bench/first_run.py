"""`./run` on a fresh clone, as a new user starts it: seconds to the web
answering, to the local fleet's torch installed behind it, and to the demo
job's first step; with package caches cold and warm, in one run.

    .venv/bin/python bench/first_run.py              # cold, then warm
    .venv/bin/python bench/first_run.py --warm-only  # the caches as they are

Each pass clones this repository's HEAD into a temporary folder and runs its
`./run` there (its own `.venv/`, state folder and port). Cold: uv and its
package cache start empty (`UV_HOME`, `UV_CACHE_DIR` in the temporary
folder), so everything is downloaded, torch's 2.6 GB included. Warm: the
machine's own uv and cache (~/.cache/regatta/uv-*, ~/.cache/uv), filled by
the cold pass or any earlier install. Read from `./run`'s console (the
"Regatta is up" line, the fleet's torch, the demo job's "→ running") and
from polling the login page.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_pass(work: Path, cold: bool, timeout_s: float, repo: Path = ROOT) -> dict:
    clone = work / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "REGATTA_STATE_DIR", "VIRTUAL_ENV",
                        "VENV")}
    if cold:
        env.update(UV_HOME=str(work / "uv-home"), UV_CACHE_DIR=str(work / "uv-cache"))
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([str(clone / "run"), "--bind", f"127.0.0.1:{port}"], cwd=clone,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    marks: dict[str, float] = {}
    lines: list[str] = []

    def read():
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            now = time.monotonic() - started
            if "Regatta is up" in line:
                marks.setdefault("console says up", now)
            if "the fleet's torch is installed" in line:
                marks.setdefault("fleet torch installed", now)
            if re.search(r"demo-gpt-tiny: \w+ → running", line):
                marks.setdefault("demo first step", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while time.monotonic() - started < timeout_s and proc.poll() is None:
            if "web answers" not in marks:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/",
                                                timeout=1) as resp:
                        if resp.status == 200:
                            marks["web answers"] = time.monotonic() - started
                except OSError:
                    pass
            if "demo first step" in marks:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        reader.join(timeout=5)
    console = "".join(lines)
    marks["console lines"] = len(console.splitlines())
    marks["packaging warnings"] = console.count("Warning:") + console.count("!!\n")
    if "demo first step" not in marks:
        print(console[-4000:])
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm-only", action="store_true")
    parser.add_argument("--repo", type=Path, default=ROOT,
                        help="the repository to clone (default: this one)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds a pass may take before it is stopped")
    args = parser.parse_args()
    passes = [("warm", False)] if args.warm_only else [("cold", True), ("warm", False)]
    results = {}
    for name, cold in passes:
        work = Path(tempfile.mkdtemp(prefix=f"regatta-first-run-{name}-"))
        try:
            results[name] = one_pass(work, cold, args.timeout, args.repo)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} s" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in results[name].items()), flush=True)
    print(f"\n{'':24}" + "".join(f"{n:>10}" for n in results))
    for key in ("web answers", "console says up", "fleet torch installed", "demo first step",
                "console lines", "packaging warnings"):
        row = [results[n].get(key) for n in results]
        print(f"{key:24}" + "".join(f"{v:>10.1f}" if isinstance(v, float) else f"{v!s:>10}"
                                    for v in row))


if __name__ == "__main__":
    main()
