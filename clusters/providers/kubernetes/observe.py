"""Pure mappings from what the API server returns (JSON dicts) to the
provider protocol's dataclasses. The reconcilers turn those into rows."""

from __future__ import annotations

from typing import Any

from ..base import (
    AttemptStatus,
    HealthSignal,
    NodeInfo,
    NodeProcess,
    StartIssue,
    interruption_key,
)
from .config import KubeSettings
from .manifests import CONTAINER, GPU, OPERATOR_INDEX_LABEL, OPERATOR_TYPE_LABEL

# Container waiting reasons no relaunch can fix: the job names an image or a
# config object (Secret, ConfigMap key) that is not there. The kubelet retries
# them forever, so without reading them the attempt would look alive until
# the start-up deadline and then be relaunched as a "hang", again and again.
USER_ERROR_WAITING = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                "ErrImageNeverPull", "CreateContainerConfigError"})
# A registry that throttles or is briefly away gives the same pull reasons;
# that is the platform's trouble, a wait rather than the user's error.
_TRANSIENT_PULL = ("toomanyrequests", "too many requests", "rate limit", "i/o timeout",
                   "tls handshake timeout", "connection reset", "503 service unavailable",
                   "500 internal server error")

# Set by AWS Node Termination Handler when EC2 announces a spot interruption
# or recommends a rebalance; the notice itself comes two minutes before.
SPOT_TAINTS = {
    "aws-node-termination-handler/spot-itn": ("spot_notice", "critical"),
    "aws-node-termination-handler/rebalance-recommendation": ("spot_notice", "warning"),
}
_SIGKILL = 9


def condition(obj: dict, kind: str) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _true(obj: dict, kind: str) -> bool:
    cond = condition(obj, kind)
    return bool(cond) and cond.get("status") == "True"


# --- attempts ----------------------------------------------------------------

def node_rank(pod: dict) -> int | None:
    labels = pod.get("metadata", {}).get("labels") or {}
    kind = (labels.get(OPERATOR_TYPE_LABEL) or "").lower()
    try:
        index = int(labels.get(OPERATOR_INDEX_LABEL, ""))
    except ValueError:
        return None
    if kind == "master":
        return 0
    if kind == "worker":
        return index + 1
    return None


def _terminated(pod: dict, container: str) -> dict | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state = status.get("state") or {}
            return state.get("terminated") or (status.get("lastState") or {}).get("terminated")
    return None


def _restarts(pod: dict) -> int:
    return sum(int(s.get("restartCount") or 0)
               for s in (pod.get("status") or {}).get("containerStatuses") or [])


def node_process(pod: dict, rank: int, fallback_node: str,
                 container: str = CONTAINER) -> NodeProcess:
    """`container`: the trainer's, by the name its workload's controller
    expects (the PyTorchJob's `pytorch`, a TrainJob's `node`)."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Unknown")
    node = (pod.get("spec") or {}).get("nodeName") or fallback_node
    running = phase in ("Pending", "Running", "Unknown")
    term = _terminated(pod, container)
    exit_code = signal = None
    tail = ""
    if term is not None and not running:
        exit_code = term.get("exitCode")
        signal = term.get("signal")
        tail = term.get("message") or ""
        if term.get("reason") == "OOMKilled":
            signal = _SIGKILL
        elif signal is None and exit_code is not None and exit_code > 128:
            signal = exit_code - 128
    if phase == "Failed" and exit_code is None and signal is None:
        # Evicted or its node went away before the container reported: the
        # process was killed from outside, which the protocol calls hardware.
        signal = _SIGKILL
        tail = f"{status.get('reason', 'Failed')}: {status.get('message', '')}".strip(": ")
        return NodeProcess(node=node, node_rank=rank, running=running, exit_code=exit_code,
                           signal=signal, log_tail=tail[-4000:], node_lost=tail[:300])
    return NodeProcess(node=node, node_rank=rank, running=running, exit_code=exit_code,
                       signal=signal, log_tail=tail[-4000:])


def _pull_is_transient(message: str) -> bool:
    text = message.lower()
    return any(marker in text for marker in _TRANSIENT_PULL)


def pod_issues(pod: dict, rank: int, own_secret: str = "") -> list[StartIssue]:
    """Why a pending pod has not started: its containers' waiting states and
    the scheduler's PodScheduled=False, in the scheduler's own words."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return []
    issues = []
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason", ""), waiting.get("message", "")
        if reason not in USER_ERROR_WAITING:
            continue  # ContainerCreating, PodInitializing: on its way
        user = not _pull_is_transient(message)
        if own_secret and f'"{own_secret}"' in message:
            # The token Secret is created just after its PyTorchJob (launch()):
            # a pod that started in between waits for it, through no fault of
            # the job's.
            user = False
        issues.append(StartIssue(reason, message[:500], user_error=user, node_rank=rank))
    scheduled = condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        issues.append(StartIssue(scheduled.get("reason") or "Unschedulable",
                                 (scheduled.get("message") or "")[:500], node_rank=rank))
    return issues


def queue_issues(job: dict, workload: dict | None = None,
                 podgroup: dict | None = None) -> list[StartIssue]:
    """Why a gang scheduler holds the whole attempt back: a Kueue Workload not
    admitted (the PyTorchJob stays suspended meanwhile) or a Volcano PodGroup
    that cannot be placed. Both are waits for capacity or quota."""
    issues = []
    if workload is not None and not _true(workload, "Admitted"):
        cond = (condition(workload, "QuotaReserved") or condition(workload, "Evicted")
                or condition(workload, "Admitted") or {})
        message = cond.get("message") or "waiting for Kueue to admit the workload"
        issues.append(StartIssue("KueuePending", message[:500]))
    elif _true(job, "Suspended"):
        cond = condition(job, "Suspended") or {}
        issues.append(StartIssue("Suspended", (cond.get("message") or "")[:500]))
    if podgroup is not None:
        phase = (podgroup.get("status") or {}).get("phase") or "Pending"
        stuck = condition(podgroup, "Unschedulable")
        if phase == "Pending" or (stuck and stuck.get("status") == "True" and phase != "Running"):
            message = (stuck or {}).get("message") or f"PodGroup is {phase}"
            issues.append(StartIssue("PodGroupPending", message[:500]))
    return issues


def taken_back(suspended: bool, workload: dict | None) -> str:
    """Kueue's words when it took an admitted job back: it suspends the job
    and marks the Workload Evicted (a job it never admitted has no such
    condition, and is a wait: queue_issues)."""
    if not suspended or workload is None or not _true(workload, "Evicted"):
        return ""
    cond = condition(workload, "Evicted") or {}
    return (f"Kueue evicted the workload ({cond.get('reason') or 'Evicted'}): "
            f"{cond.get('message') or ''}").strip()[:500]


def suspended(job: dict) -> bool:
    """A PyTorchJob its gang scheduler (Kueue) holds or took back."""
    return bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))


def ended_by(placements: list[dict], why: str) -> tuple[NodeProcess, ...]:
    """Every rank of an attempt its gang scheduler took back, ended."""
    return tuple(NodeProcess(node=p["node"], node_rank=p["node_rank"], running=False,
                             log_tail=why) for p in sorted(placements,
                                                           key=lambda p: p["node_rank"]))


def started(job: dict) -> bool:
    return _true(job, "Running") or condition(job, "Running") is not None


def attempt_status(job: dict | None, pods: list[dict], placements: list[dict], *,
                   workload: dict | None = None, podgroup: dict | None = None,
                   own_secret: str = "") -> AttemptStatus:
    """`placements` is the ref's [{"node", "node_rank"}]; pods are the job's;
    `workload` and `podgroup` are the gang scheduler's view, if it has one."""
    if job is None:
        return AttemptStatus(state="unknown", message="the PyTorchJob no longer exists")
    why = taken_back(suspended(job), workload)
    if why:
        return AttemptStatus(state="failed", nodes=ended_by(placements, why), message=why,
                             taken_back=why)
    by_rank = {}
    for pod in pods:
        rank = node_rank(pod)
        if rank is not None:
            by_rank[rank] = pod
    nodes, notes, issues = [], [], []
    for place in sorted(placements, key=lambda p: p["node_rank"]):
        rank = place["node_rank"]
        pod = by_rank.get(rank)
        if pod is None:
            if started(job):
                nodes.append(NodeProcess(node=place["node"], node_rank=rank, running=False,
                                         signal=_SIGKILL, log_tail="its pod is gone"))
            else:
                nodes.append(NodeProcess(node=place["node"], node_rank=rank, running=True))
            continue
        nodes.append(node_process(pod, rank, place["node"]))
        issues.extend(pod_issues(pod, rank, own_secret))
        if _restarts(pod):
            notes.append(f"rank {rank} restarted {_restarts(pod)}x")
        scheduled = condition(pod, "PodScheduled")
        if scheduled and scheduled.get("status") == "False":
            notes.append(f"rank {rank} unschedulable: {scheduled.get('message', '')}")
    if _true(job, "Failed") or _failed(nodes):
        state = "failed"
    elif _true(job, "Succeeded"):
        state = "succeeded"
    else:
        state = "running"
    last = _last_true(job)
    if last:
        notes.insert(0, f"{last.get('type')}: {last.get('message') or last.get('reason', '')}")
    if state == "running":
        issues[:0] = queue_issues(job, workload, podgroup)
    else:
        issues = []
    return AttemptStatus(state=state, nodes=tuple(nodes), message="; ".join(notes)[:1000],
                         start_issues=tuple(issues))


def attempt_status_of(state: str, nodes: list[NodeProcess], notes: list[str],
                      issues: list[StartIssue]) -> AttemptStatus:
    """The status from what a workload's reader found (trainjob.py): any
    failed rank fails the attempt, and only a running one waits to start."""
    if _failed(nodes):
        state = "failed"
    return AttemptStatus(state=state, nodes=tuple(nodes), message="; ".join(notes)[:1000],
                         start_issues=tuple(issues) if state == "running" else ())


def _failed(nodes: list[NodeProcess]) -> list[NodeProcess]:
    return list(AttemptStatus(state="", nodes=tuple(nodes)).failed_nodes)


def _last_true(job: dict) -> dict | None:
    true = [c for c in (job.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"]
    return true[-1] if true else None


# --- nodes -------------------------------------------------------------------

def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_info(node: dict) -> NodeInfo:
    meta, spec, status = node.get("metadata", {}), node.get("spec") or {}, node.get("status") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return NodeInfo(
        name=meta["name"],
        provider_id=spec.get("providerID", ""),
        address=addresses.get("InternalIP") or addresses.get("Hostname") or "",
        gpus=_quantity((status.get("allocatable") or {}).get(GPU, 0)),
        ready=_true(node, "Ready"),
        unschedulable=bool(spec.get("unschedulable")),
        labels=dict(meta.get("labels") or {}),
        conditions={c["type"]: c.get("status", "Unknown") for c in status.get("conditions") or []},
    )


def _kind_for(reason: str) -> str:
    text = reason.lower()
    if "xid" in text:
        return "xid"
    if "ecc" in text or "dbe" in text or "remap" in text:
        return "ecc"
    if "thermal" in text or "temperature" in text:
        return "thermal"
    return "dcgm"


def node_signals(node: dict, settings: KubeSettings) -> list[HealthSignal]:
    """Health signals one node shows now. Keys carry the condition's
    transition time, so the same condition seen on every sweep is one event."""
    name = node["metadata"]["name"]
    signals = []
    ready = condition(node, "Ready")
    if ready is not None and ready.get("status") != "True":
        signals.append(HealthSignal(
            node=name, kind="lost", severity="critical",
            message=f"node not ready: {ready.get('reason', '')} {ready.get('message', '')}".strip(),
            evidence={"condition": ready}, key=f"{name}/Ready/{ready.get('lastTransitionTime')}",
        ))
    for kind, expected in settings.health_conditions.items():
        cond = condition(node, kind)
        if cond is None or cond.get("status") == expected:
            continue
        reason = f"{cond.get('reason', '')} {cond.get('message', '')}".strip()
        signals.append(HealthSignal(
            node=name, kind=_kind_for(reason), severity="critical",
            message=f"{kind}={cond.get('status')}: {reason}"[:500],
            evidence={"condition": cond}, key=f"{name}/{kind}/{cond.get('lastTransitionTime')}",
        ))
    labels = node["metadata"].get("labels") or {}
    for label, healthy in settings.health_labels.items():
        if label in labels and labels[label] != healthy:
            signals.append(HealthSignal(
                node=name, kind=_kind_for(labels[label]), severity="critical",
                message=f"label {label}={labels[label]} (healthy: {healthy})",
                evidence={"label": label, "value": labels[label]},
                key=f"{name}/label/{label}={labels[label]}",
            ))
    status = node.get("status") or {}
    capacity = _quantity((status.get("capacity") or {}).get(GPU, 0))
    allocatable = _quantity((status.get("allocatable") or {}).get(GPU, 0))
    if allocatable < capacity:
        # NVIDIA's device plugin withdraws a GPU it saw raise a fatal XID.
        signals.append(HealthSignal(
            node=name, kind="xid", severity="critical",
            message=f"{capacity - allocatable} of {capacity} GPUs marked unhealthy by the "
                    "device plugin",
            evidence={"capacity": capacity, "allocatable": allocatable},
            key=f"{name}/gpu-allocatable/{allocatable}-of-{capacity}",
        ))
    instance = ((node.get("spec") or {}).get("providerID") or "").rstrip("/").rsplit("/", 1)[-1]
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in SPOT_TAINTS:
            kind, severity = SPOT_TAINTS[taint["key"]]
            # Keyed by the instance like the SQS notice of the same interruption.
            key = (interruption_key(instance, severity == "critical") if instance.startswith("i-")
                   else f"{name}/{taint['key']}/{taint.get('timeAdded', taint.get('value', ''))}")
            signals.append(HealthSignal(
                node=name, kind=kind, severity=severity,
                message=f"tainted {taint['key']}", evidence={"taint": taint}, key=key,
            ))
    return signals
