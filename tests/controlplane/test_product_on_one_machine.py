"""bench/gpu_product.py, the whole product on one machine, runs on CPU as it
will on a GPU (there over NCCL): the control plane on its embedded defaults
started by `regatta_up --bind` on a port of its own, a local fleet of one
node and a spare, one job of the built-in trainer that reports live metrics,
checkpoints, loses its node to a kill, resumes on the spare from its
checkpoint, succeeds with an exported model; SIGINT leaves nothing running.

It is also the check that ranks report to the port the web is bound to: with
REGATTA_PUBLIC_URL unset they used to send to :8000, and the job showed no
metric until its run ended."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(720)]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_product.py"


def test_the_whole_product_runs_its_flow_on_one_machine(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "REGATTA_PUBLIC_URL", "REGATTA_BIND")}
    # The smallest preset: the flow is the check here, not its figures
    # (tiny's training cost this run 8 s more on 2 cores). Enough steps that
    # the node is killed while the job trains: nano ran 100 in 1.4 s, and
    # a kill that came after them left attempt 2 nothing to run.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--allow-cpu", "--model", "nano", "--steps", "800",
         "--checkpoint-every", "50", "--state", str(tmp_path / "state"),
         "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=700)

    report = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, report
    result = json.loads((tmp_path / "out" / "gpu_product.json").read_text())
    checks = {name: passed for name, passed, _ in result["checks"]}
    assert checks == dict.fromkeys(
        ["live metrics", "checkpoints", "node replaced", "resumed", "succeeded",
         "exported model", "backend", "stopped"], True), report
    assert result["figures"]["final_step"] == 800
    assert result["figures"]["backends"] == ["gloo"]
