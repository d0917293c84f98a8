"""The all-reduce preflight on Slurm: the local fleet's check
(`python -m regatta.preflight` under one torchrun per node), submitted as a
Slurm job of its own on exactly the chosen nodes, so it runs where and as
the attempt will (srun, the nodes' Python, the job's GPUs).

Each node writes its report into its status folder
(`<shared_dir>/<name>/node-<rank>/status/preflight.json`); the verdict is the
local fleet's (clusters/providers/local/preflight.py). A job Slurm has not
started, or whose nodes have not all reported, by the deadline is cancelled
and the nodes that did not report are named.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from regatta import contract
from regatta.node.files import read_json

from ..base import LaunchRequest, Placement, PoolInfo, PreflightResult, preflight_evidence
from ..local.preflight import COLLECTIVE_TIMEOUT_S, ITERS, TENSOR_BYTES, node_reports
from . import attempts
from .commands import Slurm


def run(slurm: Slurm, shared: Path, cluster: str, partition: str, feature: str,
        pool: PoolInfo, placements: tuple[Placement, ...], timeout_s: float,
        python: str, reservation: str = "") -> PreflightResult:
    started = time.monotonic()
    ordered = sorted(placements, key=lambda p: p.node_rank)
    names = [p.node for p in ordered]
    name = f"preflight-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    request = LaunchRequest(
        job_id=0, attempt_id=0, attempt_number=0, name=name, pool=pool,
        placements=tuple(ordered), nproc_per_node=1, image="",
        command=("-m", "regatta.preflight"),
        env={contract.PREFLIGHT_BYTES: str(TENSOR_BYTES),
             contract.PREFLIGHT_ITERS: str(ITERS),
             contract.PREFLIGHT_TIMEOUT_S: str(max(1.0, min(COLLECTIVE_TIMEOUT_S, timeout_s)))})
    ref = attempts.launch(slurm, shared, cluster, partition, feature, request, python,
                          reservation)
    state = ""
    try:
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            reports = _reports(Path(ref["dir"]), names)
            self_failed = any(r.get("error") and not r.get("peer_failure")
                              for r in reports.values())
            state = attempts.job_record(slurm, ref).get("JobState", "")
            if self_failed or len(reports) == len(names) or state not in attempts.ACTIVE:
                break
            time.sleep(0.2)
    finally:
        attempts.scancel(slurm, str(ref["job_id"]))
    reports = _reports(Path(ref["dir"]), names)  # a last look
    failed, why, per_node = node_reports(names, reports, dcgm="not run")
    if not reports and state == "PENDING":
        why = "Slurm did not start the check before the deadline"
    evidence = preflight_evidence(per_node, seconds=time.monotonic() - started,
                                  method="allreduce", bytes=TENSOR_BYTES, iters=ITERS,
                                  slurm_job=ref["job_id"], run_dir=ref["dir"])
    message = f"preflight failed on {', '.join(failed)}: {why}" if failed else (
        f"all-reduce of {TENSOR_BYTES} bytes across {len(names)} nodes passed "
        f"(Slurm job {ref['job_id']})")
    if not failed:  # a failed one stays, as evidence
        shutil.rmtree(ref["dir"], ignore_errors=True)
        (shared / f"{name}.lock").unlink(missing_ok=True)
    return PreflightResult(ok=not failed, failed_nodes=tuple(failed), evidence=evidence,
                           message=message)


def _reports(run_dir: Path, names: list[str]) -> dict[str, dict]:
    found = {}
    for rank, node in enumerate(names):
        data = read_json(run_dir / f"node-{rank}" / "status" / "preflight.json")
        if data:
            found[node] = data
    return found

