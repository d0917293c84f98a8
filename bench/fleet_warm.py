"""What warming a local fleet's standbys costs: one torch import for the
whole fleet beside one per node, in one run.

    .venv/bin/python bench/fleet_warm.py [--nodes 4] [--runs 2]

Each run makes a fresh fleet folder and asks for a standby on every node
(regatta/node/standby.py `ensure`), then waits until each says "ready":
- **together**: one `ensure` for all the nodes, as the provider asks now
  (`hold_spares`): the first node's standby imports, then forks the others';
- **one by one** (the baseline): one `ensure` per node, each before any is
  ready, so every node's standby starts and imports on its own (how each
  was started before they were forked).

Measured: the wall time to all ready, the machine's busy CPU over it
(/proc/stat, so run it on an otherwise idle machine), and the standbys'
memory (the sum of their PSS: a forked standby shares its pages with the
one it was forked from). The two ways alternate, and each run's standbys are
killed before the next.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "worker_image"))

from regatta.node import procs, standby  # noqa: E402
from regatta.node.files import read_json  # noqa: E402


def busy_cpu_s() -> float:
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def warm(nodes: int, together: bool) -> dict:
    fleet = Path(tempfile.mkdtemp(prefix="regatta-bench-warm-")) / "fleet"
    names = [f"node-{i}" for i in range(nodes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu, began = busy_cpu_s(), time.monotonic()
    if together:
        standby.ensure(fleet, names, sys.executable, env)
    else:
        for name in names:
            standby.ensure(fleet, [name], sys.executable, env)
    while not all(standby.state(fleet, n) == "ready" for n in names):
        if time.monotonic() - began > 300:
            raise SystemExit(f"standbys not ready after 300 s: {fleet}")
        time.sleep(0.02)
    wall, cpu = time.monotonic() - began, busy_cpu_s() - cpu
    found = procs.scan(fleet=str(fleet))
    memory = sum(pss_mb(p.pid) for p in found)
    forked = sum(1 for n in names if "forked_from" in read_json(
        standby.standby_dir(fleet, n) / standby.INFO, {}))
    procs.kill_hard(found)
    procs.wait_gone(found, 10)
    return {"wall_s": wall, "cpu_s": cpu, "pss_mb": memory, "forked": forked,
            "processes": len(found)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    if standby.unavailable():
        print(f"fleet_warm: no standbys on this machine: {standby.unavailable()}")
        return 2
    results: dict[str, list[dict]] = {"one by one": [], "together": []}
    for _ in range(args.runs):
        for way in ("one by one", "together"):
            results[way].append(warm(args.nodes, together=way == "together"))
            time.sleep(2)  # let the killed standbys' memory go back
    print(f"{args.nodes} nodes, {args.runs} runs each (median), {os.cpu_count()} cores")
    print(f"{'way':<12} {'ready after':>12} {'busy CPU':>10} {'standbys PSS':>13} {'forked':>7}")
    med = {}
    for way, runs in results.items():
        med[way] = {k: statistics.median(r[k] for r in runs)
                    for k in ("wall_s", "cpu_s", "pss_mb", "forked")}
        m = med[way]
        print(f"{way:<12} {m['wall_s']:>10.1f} s {m['cpu_s']:>8.1f} s {m['pss_mb']:>10.0f} MB"
              f" {m['forked']:>7.0f}")
    base, new = med["one by one"], med["together"]
    print(f"together / one by one: ready after {new['wall_s'] / base['wall_s']:.2f}, "
          f"CPU {new['cpu_s'] / base['cpu_s']:.2f}, memory {new['pss_mb'] / base['pss_mb']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
