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

import json
import uuid

from controlplane.lib.errors import TemporaryError

from ..base import Placement, PoolInfo, PreflightResult
from . import manifests as mf
from . import trainjob as tj
from .kinds import PYTORCHJOB, TRAINJOB
from .observe import node_info, node_rank, node_signals


def run_dcgm_labels(provider, placements: tuple[Placement, ...]) -> PreflightResult:
    per_node, failed = {}, []
    for place in placements:
        node = provider._json(f"read node {place.node}", provider.core.read_node, place.node,
                              ok=(404,))
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


def run_allreduce(provider, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float) -> PreflightResult:
    started = provider._clock()
    nonce = uuid.uuid4().hex
    if provider.settings.job_api == "trainjob":
        kind, rank_of, container = TRAINJOB, tj.rank_of, tj.CONTAINER
        job = tj.preflight_train_job(pool, placements, provider.settings, nonce)
        selector = tj.pods_selector(job["metadata"]["name"])
        provider._trainjobs.create(job)
    else:
        kind, rank_of, container = PYTORCHJOB, node_rank, mf.CONTAINER
        job = mf.to_dict(mf.preflight_job(pool, placements, provider.settings, nonce=nonce))
        selector = f"{mf.OPERATOR_JOB_LABEL}={job['metadata']['name']}"
        provider._create_job(job, None)
    name = job["metadata"]["name"]
    try:
        final = provider.watch_job(name, timeout_s, kind)
        pods = provider._json(f"list pods of {name}", provider.core.list_namespaced_pod,
                              provider.ns, label_selector=selector).get("items", [])
        reports = {p["metadata"]["name"]: _report(provider, p["metadata"]["name"], container)
                   for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"}
        return _result(kind, name, final, pods, reports, rank_of, placements,
                       provider._clock() - started, timeout_s)
    finally:
        try:
            provider._call(f"delete preflight {name}",
                           provider.custom.delete_namespaced_custom_object,
                           *kind.resource[:2], provider.ns, kind.resource[2], name,
                           body={"propagationPolicy": "Background"}, ok=(404,))
        except TemporaryError:
            pass  # the job's deadline (and a PyTorchJob's TTL) end it anyway


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
    text = provider._call(f"read log of {pod}", provider.core.read_namespaced_pod_log, pod,
                          provider.ns, container=container, tail_lines=20, ok=(400, 404))
    for line in reversed((text or "").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "busbw_gbps" in doc:
            return {"ok": bool(doc.get("ok")), "busbw_gbps": float(doc["busbw_gbps"])}
    return {}
