"""The preflight health check on the local fleet: a timed gloo all-reduce across
the chosen nodes (one torchrun per node, one process each), plus DCGM
diagnostics where `dcgmi` exists.

Where a node holds a warm standby (regatta/node/standby.py), its check runs
there: the standby has imported torch and forks torchrun's agent and the
rank, so the check costs the collective and not two cold Python starts per
node, which were nearly all of it (docs/performance.md, "The first step"). The standby
leaves a successor behind at once, for the launch that follows."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from regatta import contract
from regatta.node import procs, standby
from regatta.node.files import read_json

from ..base import NodeCheck, Placement, PreflightResult, preflight_evidence
from .attempts import free_port, log_tail, torchrun_argv
from .environment import rank_environment

TENSOR_BYTES = 8 << 20
ITERS = 5
# How long a rank waits in the collective for a peer that never comes.
COLLECTIVE_TIMEOUT_S = 15.0


# What dcgmi says when no DCGM host engine (nv-hostengine) answers: DCGM
# does not run on this machine, which is no evidence about a node's GPUs.
_NO_HOST_ENGINE = ("unable to establish a connection", "unable to connect to host engine",
                   "host engine connection invalid")


def dcgm_summary(timeout_s: float, gpus: bool = True) -> str | dict:
    """DCGM's diagnostic where it can run: a dict with its verdict, or a
    string saying why it did not run (which fails no node). `gpus`: the
    checked nodes hold GPUs of their own (a `cuda` pool's); a `cpu` pool's
    logical nodes hold none, and DCGM has nothing to say about them."""
    if not gpus:
        return "not run: the nodes hold no GPUs of their own (devices: cpu)"
    dcgmi = shutil.which("dcgmi")
    if not dcgmi:
        return "dcgmi not present"
    try:
        done = subprocess.run([dcgmi, "diag", "-r", "1"], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"dcgmi diag -r 1 timed out after {timeout_s}s"}
    except OSError as exc:
        return f"dcgmi could not run: {exc}"
    text = (done.stdout + done.stderr).strip()
    if any(m in text.lower() for m in _NO_HOST_ENGINE):
        return f"DCGM is not running here (no host engine answered): {text[-300:]}"
    return {"ok": done.returncode == 0 and "fail" not in text.lower(),
            "returncode": done.returncode, "summary": text[-2000:]}


def _verdict(names: list[str], results: dict[str, dict]) -> tuple[list[str], str]:
    own = [n for n in names if results.get(n, {}).get("error")
           and not results[n].get("peer_failure")]
    if own:
        return own, "failed its self-test: " + "; ".join(results[n]["error"] for n in own)
    missing = [n for n in names if n not in results]
    if missing:
        return missing, "did not report before the deadline"
    errored = [n for n in names if results[n].get("error")]
    if errored:
        return errored, "the all-reduce failed: " + results[errored[0]]["error"]
    return [], ""


def run_preflight(fleet: Path, placements: tuple[Placement, ...], bad: set[str],
                  timeout_s: float, python: str = sys.executable,
                  standbys: bool = False, gpus: bool = True) -> PreflightResult:
    started = time.monotonic()
    ordered = sorted(placements, key=lambda p: p.node_rank)
    names = [p.node for p in ordered]
    run_dir = fleet / "preflight" / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    port = free_port()
    collective_timeout = max(1.0, min(COLLECTIVE_TIMEOUT_S, timeout_s))
    children = []
    warm: list[str] = []
    for i, placement in enumerate(ordered):
        env = rank_environment({
            "OMP_NUM_THREADS": "1", contract.NODE: placement.node,
            contract.PREFLIGHT_OUT: str(run_dir / f"node-{i}.json"),
            contract.PREFLIGHT_BYTES: str(TENSOR_BYTES),
            contract.PREFLIGHT_ITERS: str(ITERS),
            contract.PREFLIGHT_TIMEOUT_S: str(collective_timeout),
            procs.FLEET_TAG: str(fleet), procs.ATTEMPT_TAG: str(run_dir),
        })
        if placement.node in bad:
            env[contract.PREFLIGHT_FAULT] = "simulated hardware fault (operator fault injection)"
        argv = torchrun_argv(python, len(ordered), i, 1, port, ("-m", "regatta.preflight"))
        node_dir = run_dir / f"node-{i}"
        node_dir.mkdir()
        if standbys and standby.hand_over(fleet, placement.node, node_dir, argv, env, python):
            warm.append(placement.node)
            continue
        with open(run_dir / f"node-{i}.log", "ab") as log:
            children.append(subprocess.Popen(argv, env=env, cwd=run_dir, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True))
    deadline = started + timeout_s
    results: dict[str, dict] = {}
    try:
        while time.monotonic() < deadline:
            for i, name in enumerate(names):
                if name not in results:
                    data = read_json(run_dir / f"node-{i}.json")
                    if data:
                        results[name] = data
            self_failed = any(r.get("error") and not r.get("peer_failure")
                              for r in results.values())
            # With every report in, torchrun's orderly shutdown is only a wait.
            if self_failed or len(results) == len(names) or _all_ended(
                    children, [run_dir / f"node-{i}" for i, n in enumerate(names) if n in warm]):
                break
            time.sleep(0.1)
    finally:
        procs.kill_hard(procs.scan(attempt_dir=str(run_dir)))
        for child in children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    for i, name in enumerate(names):  # a last look: some may have written at the end
        if name not in results and (data := read_json(run_dir / f"node-{i}.json")):
            results[name] = data
    dcgm = dcgm_summary(max(5.0, deadline - time.monotonic()), gpus)
    failed, why, per_node = node_reports(names, results, dcgm)
    for i, name in enumerate(names):
        if name in failed:  # what its torchrun said, beside the verdict
            per_node[name]["log_tail"] = (log_tail(run_dir / f"node-{i}.log", 20)
                                          or log_tail(run_dir / f"node-{i}" / "stdout.log", 20))
    evidence = preflight_evidence(
        per_node, seconds=time.monotonic() - started,
        method="allreduce", bytes=TENSOR_BYTES, iters=ITERS, dcgm=dcgm, run_dir=str(run_dir),
        warm_nodes=warm,
    )
    message = f"preflight failed on {', '.join(failed)}: {why}" if failed else (
        f"all-reduce of {TENSOR_BYTES} bytes across {len(names)} nodes passed")
    return PreflightResult(ok=not failed, failed_nodes=tuple(failed), evidence=evidence,
                           message=message)


def _all_ended(children: list, warm_dirs: list[Path]) -> bool:
    """Every node's processes have exited: the cold ones' torchrun, and the
    warm ones' launcher (the standby it became) has written its exit."""
    return (all(c.poll() is not None for c in children)
            and all((d / "exit.json").exists() for d in warm_dirs))


def node_reports(names: list[str], results: dict[str, dict], dcgm: str | dict
                 ) -> tuple[list[str], str, dict[str, NodeCheck]]:
    """The verdict on the nodes' reports, and DCGM's where it ran: (the
    nodes that failed, why, each node's check in the protocol's shape).
    The Slurm provider's check (clusters/providers/slurm/preflight.py)
    reads its nodes' reports the same way."""
    failed, why = _verdict(names, results)
    if isinstance(dcgm, dict) and not dcgm["ok"] and not failed:
        failed, why = names, "dcgmi diag -r 1 failed"
    return failed, why, _per_node(names, results, failed, dcgm)


def _per_node(names: list[str], results: dict[str, dict], failed: list[str],
              dcgm: str | dict) -> dict[str, NodeCheck]:
    """Each node's report in the protocol's shape, naming the check it failed."""
    self_failed = any(r.get("error") and not r.get("peer_failure") for r in results.values())
    per_node: dict[str, NodeCheck] = {}
    for name in names:
        report = dict(results.get(name) or {})
        if name not in results:
            report.update(node=name, check="report", error="no report before the deadline")
            if self_failed:
                report.update(error="stopped: another node failed its self-test", aborted=True)
        elif report.get("error"):
            report["check"] = "allreduce" if report.get("peer_failure") else "self-test"
        elif name in failed and isinstance(dcgm, dict):
            report.update(check="dcgm", error=dcgm.get("summary", "")[-500:])
        report["ok"] = name not in failed
        per_node[name] = report
    return per_node
