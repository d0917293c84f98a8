"""The test cluster's build lock (testcluster/build.py): `make test` starts a
cold build in the background and the first real-cluster test waits while it
runs, so "a build runs" must be seen from another process, and a second
builder must wait for the first and then find its binaries.

A real lock held by a real second process; no Go build runs here (the
folder is a temporary one, the binaries are empty files)."""

from __future__ import annotations

import subprocess
import sys
import time

from testcluster import build

HOLD = """
import sys, time
from pathlib import Path
from testcluster import build
with build._build_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    for c in build.COMPONENTS:
        (Path(sys.argv[1]) / c.name).write_text("")
"""


def _hold(folder, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_build_in_another_process_is_seen_and_waited_for(tmp_path):
    folder = tmp_path / "k8s-test" / "bin"
    folder.mkdir(parents=True)
    assert not build.building_now(folder)

    holder = _hold(folder, 1.5)
    assert build.building_now(folder)
    assert not build.binaries_present(folder)
    started = time.monotonic()
    build.wait_while_building(timeout=30, folder=folder)
    assert time.monotonic() - started > 0.5
    assert not build.building_now(folder)
    assert build.binaries_present(folder)
    assert holder.wait(timeout=10) == 0


def test_waiting_gives_up_at_its_timeout(tmp_path):
    folder = tmp_path / "k8s-test" / "bin"
    folder.mkdir(parents=True)
    holder = _hold(folder, 30)
    try:
        started = time.monotonic()
        build.wait_while_building(timeout=1, folder=folder)
        assert time.monotonic() - started < 10
        assert build.building_now(folder)
    finally:
        holder.kill()
        holder.wait()
    assert not build.building_now(folder)
