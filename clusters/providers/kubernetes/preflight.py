"""Preflight checks before an attempt starts, in one of two ways (the
cluster setting `preflight`):

- "allreduce" (default): a small job, one pod per chosen node, runs a few
  all-reduces and reports the bus bandwidth; a node whose pod fails is
  named in `failed_nodes`. A PyTorchJob, or with `job_api: trainjob` a
  TrainJob against the same runtime as the attempts (trainjob.py), so a
  cluster with Trainer v2 alone runs it too.
- "dcgm-labels": no pods at all. The check is delegated to the node health
  checks that already run on the nodes (NVIDIA DCGM through EKS's node
  monitoring agent, the device plugin's XID checks): a node passes when it
  is Ready and shows no critical health signal. Cheaper and instant, but it
  does not exercise the network between the nodes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime

from controlplane.lib.errors import TemporaryError

from ..base import Placement, PoolInfo, PreflightResult
from . import manifests as mf
from . import trainjob as tj
from .kinds import PYTORCHJOB, TRAINJOB
from .observe import node_info, node_rank, node_signals


def run_dcgm_labels(provider, placements: tuple[Placement, ...]) -> PreflightResult:
    per_node, failed = {}, []
    for place in placements:
        node = provider.reads.node(place.node)
        if node is None:
            per_node[place.node] = {"ready": False, "signals": ["node does not exist"]}
            failed.append(place.node)
            continue
        info = node_info(node)
        critical = [s.message for s in node_signals(node, provider.settings)
                    if s.severity == "critical"]
        per_node[place.node] = {"ready": info.ready, "signals": critical,
                                "conditions": info.conditions}
        if critical or not info.ready or info.unschedulable:
            failed.append(place.node)
    return PreflightResult(
        ok=not failed, failed_nodes=tuple(failed),
        evidence={"method": "dcgm-labels", "note": "delegated to DCGM health checks",
                  "per_node": per_node},
        message="nodes healthy by their DCGM checks" if not failed
        else f"unhealthy by their DCGM checks: {', '.join(failed)}",
    )


# Set on a preflight job: which nodes it checks, so a later pass (on any
# worker) finds the check an earlier one started and reads its result.
LABEL_CHECKS = "regatta.io/preflight-for"


def checks_label(placements: tuple[Placement, ...]) -> str:
    nodes = ",".join(f"{p.node_rank}:{p.node}" for p in sorted(placements,
                                                               key=lambda p: p.node_rank))
    return hashlib.sha256(nodes.encode()).hexdigest()[:40]


def run_allreduce(provider, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float) -> PreflightResult:
    """Beside the pass, never in it: the first call starts the check and
    answers `pending`; each later call with the same placements reads the
    check it finds (by LABEL_CHECKS) and answers pending until it finished
    or `timeout_s` passed since it started, then the result, once: the
    check's job is deleted as its result is read."""
    trainjob = provider.settings.job_api == "trainjob"
    kind = TRAINJOB if trainjob else PYTORCHJOB
    label = checks_label(placements)
    found = _running_check(provider, kind, label)
    if found is None:
        name = _start(provider, pool, placements, trainjob, label)
        return PreflightResult(ok=False, pending=True, evidence={"method": "allreduce",
                                                                 "job": name},
                               message=f"all-reduce check {name} started")
    name = found["metadata"]["name"]
    age = _age_s(found)
    if not kind.finished(found) and age < timeout_s:
        return PreflightResult(ok=False, pending=True,
                               evidence={"method": "allreduce", "job": name},
                               message=f"all-reduce check {name} running for {age:.0f} s")
    try:
        if trainjob:
            rank_of, container, selector = tj.rank_of, tj.CONTAINER, tj.pods_selector(name)
        else:
            rank_of, container = node_rank, mf.CONTAINER
            selector = f"{mf.OPERATOR_JOB_LABEL}={name}"
        pods = provider.reads.pods(selector, f"list pods of {name}")
        reports = {p["metadata"]["name"]: _report(provider, p["metadata"]["name"], container)
                   for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"}
        return _result(kind, name, found, pods, reports, rank_of, placements, age, timeout_s)
    finally:
        try:
            provider._call(f"delete preflight {name}",
                           provider.custom.delete_namespaced_custom_object,
                           *kind.resource[:2], provider.ns, kind.resource[2], name,
                           body={"propagationPolicy": "Background"}, ok=(404,))
        except TemporaryError:
            pass  # the job's deadline (and a PyTorchJob's TTL) end it anyway


def _start(provider, pool, placements, trainjob: bool, label: str) -> str:
    nonce = uuid.uuid4().hex
    if trainjob:
        job = tj.preflight_train_job(pool, placements, provider.settings, nonce)
        job["metadata"]["labels"][LABEL_CHECKS] = label
        provider.job_apis[TRAINJOB.name].create(job)
    else:
        job = mf.to_dict(mf.preflight_job(pool, placements, provider.settings, nonce=nonce))
        job["metadata"]["labels"][LABEL_CHECKS] = label
        provider.job_apis[PYTORCHJOB.name].create(job, None)
    return job["metadata"]["name"]


def _running_check(provider, kind, label: str) -> dict | None:
    """The newest check of these placements that is not being deleted. One
    the cache has not seen yet (made a moment ago, by this pass or another
    worker's) is asked of the server before a second is started."""
    selector = f"{LABEL_CHECKS}={label}"
    found = provider.reads.jobs(kind, selector) or provider.reads.jobs_unseen(kind, selector)
    checks = [j for j in found if not j["metadata"].get("deletionTimestamp")]
    checks.sort(key=lambda j: j["metadata"].get("creationTimestamp") or "")
    return checks[-1] if checks else None


def _age_s(job: dict) -> float:
    created = job["metadata"].get("creationTimestamp")
    if not created:
        return 0.0
    when = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return max(0.0, (datetime.now(UTC) - when).total_seconds())


def _result(kind, name, final, pods, reports, rank_of, placements, seconds,
            timeout_s) -> PreflightResult:
    ordered = [p.node for p in sorted(placements, key=lambda p: p.node_rank)]
    per_node, failed, bandwidth = {}, [], []
    for pod in pods:
        rank = rank_of(pod)
        if rank is None:
            continue
        node = (pod.get("spec") or {}).get("nodeName") or (
            ordered[rank] if rank < len(ordered) else "")
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        report = reports.get(pod["metadata"]["name"], {})
        per_node[node] = {"phase": phase, **report}
        if "busbw_gbps" in report:
            bandwidth.append(report["busbw_gbps"])
        if phase == "Failed" or (phase == "Succeeded" and report.get("ok") is False):
            failed.append(node)
    succeeded = final is not None and any(
        c.get("type") in ("Succeeded", "Complete") and c.get("status") == "True"
        for c in (final.get("status") or {}).get("conditions") or [])
    evidence = {"method": "allreduce", "job": name, "seconds": round(seconds, 3),
                "per_node": per_node}
    if bandwidth:
        evidence["allreduce_gbps"] = min(bandwidth)
    if succeeded and not failed:
        return PreflightResult(ok=True, evidence=evidence,
                               message=f"all-reduce across {len(placements)} nodes passed")
    if failed:
        message = f"all-reduce failed on {', '.join(sorted(failed))}"
    elif final is None:
        message = f"the preflight {kind.name} disappeared"
    else:
        message = f"all-reduce did not finish within {timeout_s:.0f}s"
    return PreflightResult(ok=False, failed_nodes=tuple(sorted(failed)), evidence=evidence,
                           message=message)


def _report(provider, pod: str, container: str) -> dict:
    """The JSON line the preflight script prints, from the pod's log."""
    text, unreachable = provider.read_log(pod, container, tail_lines=20)
    if unreachable:
        return {"log": unreachable}
    for line in reversed(text.splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "busbw_gbps" in doc:
            return {"ok": bool(doc.get("ok")), "busbw_gbps": float(doc["busbw_gbps"])}
    return {}
