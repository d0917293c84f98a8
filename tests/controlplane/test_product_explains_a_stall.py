"""bench/gpu_product.py explains a run that stops short: a job made to stall
on purpose (rank 1 never gets past its imports, so rank 0 waits for it in
the rendezvous and nothing ever reports) runs past the flow's wait for a
first loss point, and before the control plane stops, the run writes where
everything stood: the job's StartupReport naming what each rank is doing,
the ranks' own start-up markers, the stalled rank's process in the process
tree. The whole product, on CPU, as a GPU run would be."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_product.py"
STALLED = ROOT / "tests" / "support" / "stalled_ranks.py"


def test_a_run_whose_job_stalls_says_what_its_ranks_were_doing(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "REGATTA_PUBLIC_URL", "REGATTA_BIND")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--allow-cpu", "--nodes", "2", "--standbys", "off",
         "--start-timeout", "50", "--state", str(tmp_path / "state"),
         "--out", str(tmp_path / "out"),
         "--job", json.dumps({"num_nodes": 2, "entrypoint": [str(STALLED)]}),
         "--cluster-settings", json.dumps({"preflight": False, "startup_report_after_s": 20})],
        env=env, capture_output=True, text=True, timeout=450)

    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, report
    result = json.loads((tmp_path / "out" / "gpu_product.json").read_text())
    checks = {name: (passed, detail) for name, passed, detail in result["checks"]}
    assert checks["flow"] == (False, "TimeoutError: a first loss point: not within 50 s")
    assert checks["stopped"][0], checks["stopped"]

    told = (tmp_path / "out" / "gpu_product.txt").read_text()
    assert "=== why the run stopped: TimeoutError: a first loss point" in told
    # The product's own account, on the job's timeline.
    startup = next(line for line in told.splitlines() if "StartupReport:" in line)
    assert "no rank heard from" in startup, startup
    assert "rank 0: rendezvous" in startup and "rank 1: importing" in startup, startup
    # The ranks' records on disk and their processes, as they were.
    assert '"phase": "rendezvous"' in told  # rank 0's start-up marker
    tree = told[told.index("##### processes"):told.index("##### this machine")]
    assert sum("stalled_ranks.py" in line and line.startswith("*")
               for line in tree.splitlines()) >= 2, tree
    # stdout carries it too, for a run whose files do not come back.
    assert "where the run stood" in proc.stdout and "StartupReport" in proc.stdout
