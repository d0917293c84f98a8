"""Where the test suite's CPU goes, test by test.

    .venv/bin/python tools/suite_cpu.py [--out FILE] [--top N] [-- PYTEST_ARGS]

runs the suite as `make test` does (two pytest-xdist workers, `--dist
loadfile`; PYTEST_ARGS replace the default `tests`) with each worker in a
CPU-accounting cgroup of its own. A process inherits its parent's cgroup
whatever it does after (a new session, a double fork, its own environment),
so a worker's cgroup counts everything its tests started: torchrun agents,
ranks, standbys, webs, Chromium. Each test is charged its worker's cgroup
CPU from its start to its end, and the long-lived daemons of the real test
clusters (Kubernetes, Slurm), which a test starts once for the rest, are
moved to a cgroup of their own and counted apart. What no worker started
(PostgreSQL, Redis, the kernel) is the machine's busy CPU less both.

Prints the totals, then the CPU by folder, by file and by test, and writes
every test's figures as JSON (`--out`). Needs root and cgroup v1's cpuacct
hierarchy or cgroup v2. The suite's wall time is its CPU time over the
cores (it is CPU-bound), so this says where shortening it has to start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "REGATTA_SUITE_CPU_DIR"


def daemon_names() -> frozenset[str]:
    """The real clusters' daemons as /proc/PID/comm names them (cut to 15
    characters): the binaries testcluster/ builds and slurmcluster/ starts."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from slurmcluster.cluster import DAEMONS
    from testcluster.build import COMPONENTS

    return frozenset(name[:15] for name in [*(c.name for c in COMPONENTS), *DAEMONS])


# -- cgroups -----------------------------------------------------------------------------------

def hierarchy() -> Path:
    """The folder the run's cgroups are made in: cgroup v1's cpuacct
    hierarchy, or else cgroup v2's (whose cpu.stat every cgroup has)."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists():
        return v1
    for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (v2 / "cgroup.controllers").exists():
            return v2
    raise SystemExit("suite_cpu: no cgroup v1 cpuacct or cgroup v2 hierarchy here")


def cpu_seconds(group: Path) -> float:
    """CPU time of everything that ran in `group`, in seconds."""
    usage = group / "cpuacct.usage"
    if usage.exists():
        return int(usage.read_text()) / 1e9
    for line in (group / "cpu.stat").read_text().splitlines():
        key, value = line.split()
        if key == "usage_usec":
            return int(value) / 1e6
    return 0.0


def join(group: Path, pid: int) -> None:
    (group / "cgroup.procs").write_text(str(pid))


def machine_busy() -> float:
    """The machine's busy CPU seconds since boot (all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# -- in each pytest-xdist worker (loaded with -p suite_cpu) -----------------------------------

_records: list[tuple[str, float, float, float]] = []
_started: dict[str, tuple[float, float, float]] = {}
_group: Path | None = None
_worker = ""


def _now() -> tuple[float, float, float]:
    return cpu_seconds(_group), time.process_time(), time.monotonic()


def pytest_configure(config) -> None:
    global _group, _worker
    where = os.environ.get(ENV)
    # A worker by xdist's own word, not by PYTEST_XDIST_WORKER: a run
    # started from inside a worker (this tool's own test) inherits that
    # variable in its controller, which would then charge the tests that
    # its workers report to its own cgroup.
    worker = getattr(config, "workerinput", {}).get("workerid")
    if not where or not worker:
        return  # the controller: the workers run the tests
    _worker = worker
    _group = Path(where) / worker
    _group.mkdir(exist_ok=True)
    join(_group, os.getpid())


def pytest_runtest_logstart(nodeid, location) -> None:
    if _group is not None:
        _started[nodeid] = _now()


def pytest_runtest_logfinish(nodeid, location) -> None:
    began = _started.pop(nodeid, None)
    if began is not None:
        ended = _now()
        _records.append((nodeid, *(b - a for a, b in zip(began, ended, strict=True))))


def pytest_sessionfinish(session) -> None:
    if _group is not None:
        out = Path(os.environ[ENV + "_OUT"]) / f"{_worker}.json"
        out.write_text(json.dumps({"tests": _records, "cgroup_s": cpu_seconds(_group)}))


# -- the run -----------------------------------------------------------------------------------

def _move_daemons(workers: Path, daemons: Path, stop: threading.Event) -> None:
    """Move the clusters' daemons out of the worker that started them."""
    names = daemon_names()
    while not stop.wait(1.0):
        for procs in workers.glob("gw*/cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() in names:
                        join(daemons, int(pid))
                except OSError:
                    pass  # gone meanwhile


def report(results: dict, top: int) -> str:
    tests = results["tests"]
    lines = [f"wall {results['wall_s']:.0f} s, machine busy {results['busy_s']:.0f} CPU-s "
             f"({results['busy_s'] / results['wall_s']:.2f} cores); exit {results['exit']}",
             f"  workers' cgroups {results['workers_s']:.0f} CPU-s (the tests' own: "
             f"{sum(t['cpu_s'] for t in tests):.0f}, in the workers' processes "
             f"{sum(t['self_s'] for t in tests):.0f})",
             f"  the clusters' daemons {results['daemons_s']:.0f} CPU-s; the rest "
             f"(PostgreSQL, Redis, the kernel, ...) "
             f"{results['busy_s'] - results['workers_s'] - results['daemons_s']:.0f} CPU-s"]
    folders, files, counts, selfs = Counter(), Counter(), Counter(), Counter()
    for t in tests:
        path = t["test"].split("::")[0]
        folders["/".join(path.split("/")[:2])] += t["cpu_s"]
        files[path] += t["cpu_s"]
        selfs[path] += t["self_s"]
        counts[path] += 1
    lines += ["", "CPU-s  by folder"]
    lines += [f"{cpu:6.0f}  {name}" for name, cpu in folders.most_common()]
    lines += ["", "CPU-s  in-worker  tests  by file"]
    lines += [f"{cpu:6.0f}  {selfs[name]:9.0f}  {counts[name]:5d}  {name}"
              for name, cpu in files.most_common(top)]
    lines += ["", "CPU-s  in-worker   wall  by test"]
    lines += [f"{t['cpu_s']:6.1f}  {t['self_s']:9.1f}  {t['wall_s']:5.1f}  {t['test']}"
              for t in sorted(tests, key=lambda t: -t["cpu_s"])[:top]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("suite_cpu.json"))
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--workers", default="2")
    parser.add_argument("pytest_args", nargs="*", default=["tests"])
    args = parser.parse_args()

    root = hierarchy() / f"regatta-suite-cpu-{os.getpid()}"
    daemons = root / "daemons"
    daemons.mkdir(parents=True)
    stop = threading.Event()
    mover = threading.Thread(target=_move_daemons, args=(root, daemons, stop), daemon=True)
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, ENV: str(root), ENV + "_OUT": out,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"),
                                                           os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "pytest", "-n", args.workers, "--dist", "loadfile",
                   "-p", "suite_cpu", *args.pytest_args]
        busy, began = machine_busy(), time.monotonic()
        mover.start()
        exit_code = subprocess.call(command, cwd=ROOT, env=env)
        stop.set()
        mover.join()
        wall, busy = time.monotonic() - began, machine_busy() - busy
        workers = [json.loads(p.read_text()) for p in sorted(Path(out).glob("gw*.json"))]
    results = {
        "wall_s": wall, "busy_s": busy, "exit": exit_code,
        "workers_s": sum(w["cgroup_s"] for w in workers), "daemons_s": cpu_seconds(daemons),
        "tests": [{"test": name, "cpu_s": cpu, "self_s": own, "wall_s": spent}
                  for w in workers for name, cpu, own, spent in w["tests"]]}
    for group in [*(p for p in root.iterdir() if p.is_dir()), root]:
        try:
            group.rmdir()
        except OSError:  # a process of the run lives on in it
            print(f"suite_cpu: {group} kept: a process of the run still runs in it")
    args.out.write_text(json.dumps(results, indent=1))
    print(report(results, args.top))
    print(f"\nevery test's figures: {args.out}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
