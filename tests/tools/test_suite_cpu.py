"""tools/suite_cpu.py charges each test the CPU of everything it started,
however the process left its parent (here a new session, as the fleet's
agents do), by running the workers in cgroups of their own."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "tools" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_cpu)

pytestmark = pytest.mark.slow

TESTS = '''
import subprocess, sys

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.5: pass"


def test_burns_in_a_process_of_its_own_session():
    subprocess.run([sys.executable, "-c", BURN], start_new_session=True, check=True)


def test_burns_nothing():
    pass
'''


def cgroups_unwritable() -> str:
    """Why the run's cgroups cannot be made here, or ""."""
    try:
        base = suite_cpu.hierarchy()
    except SystemExit as exc:
        return str(exc)
    return "" if os.access(base, os.W_OK) else f"{base} is not writable (not root)"


# Skipped only off CI: CI runs as root on a machine with cgroups, and fails
# here rather than skip, as the real clusters' tests do.
UNWRITABLE = "" if os.environ.get("CI") == "true" else cgroups_unwritable()


@pytest.mark.skipif(bool(UNWRITABLE), reason=f"suite_cpu cannot run here: {UNWRITABLE}")
def test_a_test_is_charged_the_cpu_of_the_processes_it_started(tmp_path):
    (tmp_path / "test_burn.py").write_text(TESTS)
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "suite_cpu.py"), "--out", str(out), "--",
         str(tmp_path / "test_burn.py"), "-p", "no:randomly", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull],
        capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = {t["test"].split("::")[-1]: t for t in json.loads(out.read_text())["tests"]}
    burned = figures["test_burns_in_a_process_of_its_own_session"]
    idle = figures["test_burns_nothing"]
    assert 1.4 <= burned["cpu_s"] < 3.0 and burned["self_s"] < 1.0
    assert idle["cpu_s"] < 0.5
    assert "test_burn.py" in proc.stdout.split("by file")[1]


def row(name, cpu):
    return {"test": name, "cpu_s": cpu, "self_s": cpu / 2, "wall_s": cpu}


def test_the_daemons_are_the_clusters_binaries_as_proc_names_them():
    names = suite_cpu.daemon_names()
    assert {"kube-apiserver", "trainer-control", "slurmctld", "munged"} <= names
    assert all(len(name) <= 15 for name in names)


def test_the_report_sums_by_folder_and_file_costliest_first():
    results = {"wall_s": 10.0, "busy_s": 18.0, "exit": 0, "workers_s": 12.0, "daemons_s": 2.0,
               "tests": [row("tests/a/test_x.py::t1", 1.0), row("tests/a/test_x.py::t2", 2.0),
                         row("tests/b/test_y.py::t3", 5.0)]}
    text = suite_cpu.report(results, top=10)
    assert "1.80 cores" in text and "the rest (PostgreSQL, Redis, the kernel, ...) 4 CPU-s" in text
    folders = text.split("by folder\n")[1].split("\n\n")[0].splitlines()
    assert [line.split() for line in folders] == [["5", "tests/b"], ["3", "tests/a"]]
    assert text.index("t3") < text.index("t2") < text.index("t1")
