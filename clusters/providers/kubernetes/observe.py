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
                   own_secret: str = "", lost: dict[int, NodeProcess] | None = None,
                   refused: list[StartIssue] | None = None) -> AttemptStatus:
    """`placements` is the ref's [{"node", "node_rank"}]; pods are the job's;
    `workload` and `podgroup` are the gang scheduler's view, if it has one;
    `lost` the ranks whose pod went with its node (lost_ranks); `refused`
    why a controller could not make the pods (event_issues)."""
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
    lost = lost or {}
    for place in sorted(placements, key=lambda p: p["node_rank"]):
        rank = place["node_rank"]
        pod = by_rank.get(rank)
        if rank in lost:
            nodes.append(lost[rank])
            continue
        if pod is None:
            nodes.append(_without_pod(place, started(job) and not refused))
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
        if len(by_rank) < len(placements):
            issues.extend(refused or ())
    else:
        issues = []
    return AttemptStatus(state=state, nodes=tuple(nodes), message="; ".join(notes)[:1000],
                         start_issues=tuple(issues))


def _without_pod(place: dict, gone: bool) -> NodeProcess:
    """A rank with no pod: gone once its job started (unless a controller
    says it cannot make it, event_issues: a wait), else not made yet."""
    if gone:
        return NodeProcess(node=place["node"], node_rank=place["node_rank"], running=False,
                           signal=_SIGKILL, log_tail="its pod is gone")
    return NodeProcess(node=place["node"], node_rank=place["node_rank"], running=True)


def pods_by_rank(pods: list[dict], rank_of) -> dict[int, dict]:
    """One pod per rank: the newest, should a controller have made it again."""
    by_rank: dict[int, dict] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        rank = rank_of(pod)
        if rank is not None:
            by_rank[rank] = pod
    return by_rank


def attempt_status_of(state: str, nodes: list[NodeProcess], notes: list[str],
                      issues: list[StartIssue]) -> AttemptStatus:
    """The status from what a workload's reader found (trainjob.py): any
    failed rank fails the attempt, and only a running one waits to start."""
    if _failed(nodes):
        state = "failed"
    return AttemptStatus(state=state, nodes=tuple(nodes), message="; ".join(notes)[:1000],
                         start_issues=tuple(issues) if state == "running" else ())


# Why Kubernetes deleted a pod (its DisruptionTarget condition): these say
# the node went or failed under it. Others (a preemption, an eviction through
# the API) say nothing against the node.
NODE_DISRUPTIONS = frozenset({"DeletionByPodGC", "DeletionByTaintManager",
                              "TerminationByKubelet"})
_TERMINAL = ("Succeeded", "Failed")


def lost_ranks(by_rank: dict[int, dict], tombstones: list[dict], gone_nodes: set[str],
               rank_of) -> dict[int, NodeProcess]:
    """Ranks that ended with their node, each on the node it really ran on
    (the pod's spec.nodeName, never the planned one):

    - a live pod bound to a node that no longer exists (its Node deleted):
      seen when the node goes, not a minute later when the pod GC fails it;
    - a pod of the attempt that was deleted while it ran (a tombstone) and
      is missing now or was re-created (another uid, perhaps elsewhere):
      lost on the node it ran on, with node-level evidence when its node is
      gone or Kubernetes deleted it for the node (NODE_DISRUPTIONS), and as
      a rank killed from outside otherwise (a preemption, an eviction).

    `tombstones` are this attempt's deleted pods only; `rank_of` reads a
    pod's rank."""
    lost: dict[int, NodeProcess] = {}
    for rank, pod in by_rank.items():
        node = (pod.get("spec") or {}).get("nodeName") or ""
        phase = (pod.get("status") or {}).get("phase")
        if node and node in gone_nodes and phase not in _TERMINAL:
            why = (f"node {node} is gone (its Node was deleted) with rank {rank}'s pod "
                   f"{pod['metadata']['name']}")
            lost[rank] = NodeProcess(node=node, node_rank=rank, running=False, signal=_SIGKILL,
                                     log_tail=why, node_lost=why)
    for dead in tombstones:
        rank = rank_of(dead)
        if rank is None or rank in lost:
            continue
        now = by_rank.get(rank)
        uid = dead["metadata"].get("uid")
        if now is not None and now["metadata"].get("uid") == uid:
            continue
        status = dead.get("status") or {}
        node = (dead.get("spec") or {}).get("nodeName") or ""
        if not node or (status.get("phase") in _TERMINAL and _exited(dead)):
            continue  # never ran, or it ended by itself before it went
        disruption = condition(dead, "DisruptionTarget") or {}
        reason = disruption.get("reason") or ""
        where = f"rank {rank}'s pod {dead['metadata']['name']} on {node}"
        if node in gone_nodes or reason in NODE_DISRUPTIONS:
            why = (f"node {node} is gone (its Node was deleted)" if node in gone_nodes
                   else f"{reason}: {disruption.get('message') or ''}".strip(": "))
            why = f"{why}; {where} was deleted" + (" and re-created" if now else "")
            lost[rank] = NodeProcess(node=node, node_rank=rank, running=False,
                                     signal=_SIGKILL, log_tail=why[:1000], node_lost=why[:300])
        else:
            why = (f"{where} was deleted ({reason or 'not by its node'})"
                   + (" and re-created" if now else ""))
            lost[rank] = NodeProcess(node=node, node_rank=rank, running=False,
                                     signal=_SIGKILL, log_tail=why[:1000])
    return lost


def _exited(pod: dict) -> bool:
    return any((cs.get("state") or {}).get("terminated")
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


# Warning events that say a controller could not make what it was asked to:
# the pod (quota, an admission webhook, PodSecurity, a missing PriorityClass
# or ServiceAccount), a Job or a JobSet's parts, or Kueue's refusal.
_REFUSAL_WORDS = ("forbidden", "denied", "exceeded quota", "admission webhook",
                  "not found", "invalid", "violates", "error creating", "failed")
_OWNERS = frozenset({"PyTorchJob", "TrainJob", "JobSet", "Job", "Workload"})


def event_issues(events: list[dict], name: str, since: str = "") -> list[StartIssue]:
    """Why the pods of the job `name` do not exist, in the API server's own
    words: the Warning events of the job, what its controller made of it
    (a TrainJob's JobSet and Jobs, named after it) and Kueue's Workload,
    newest first, each (reason, message) once. `since`: the job's
    creationTimestamp, so an earlier object of the same name says nothing."""
    found: dict[tuple[str, str], tuple[str, StartIssue]] = {}
    for event in events:
        obj = event.get("involvedObject") or {}
        owner = obj.get("name") or ""
        if obj.get("kind") not in _OWNERS:
            continue
        if not (owner == name or owner.startswith(f"{name}-") or f"-{name}-" in owner):
            continue
        when = (event.get("lastTimestamp") or event.get("eventTime")
                or (event.get("metadata") or {}).get("creationTimestamp") or "")
        if since and when and when < since:
            continue
        reason, message = event.get("reason") or "", event.get("message") or ""
        text = f"{reason} {message}".lower()
        if not any(word in text for word in _REFUSAL_WORDS):
            continue
        issue = StartIssue(reason or "FailedCreate", f"{obj.get('kind')} {owner}: {message}"[:500])
        key = (reason, message)
        if key not in found or found[key][0] < when:
            found[key] = (when, issue)
    return [issue for _, issue in sorted(found.values(), key=lambda f: f[0], reverse=True)][:3]


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


# Written on a Node when Regatta cordons it, removed when Regatta lifts its
# cordon: a node unschedulable without it was cordoned by someone else.
CORDONED_BY_REGATTA = "regatta.io/cordoned"
# Taints every cordoned or GPU node carries, which say nothing of why.
_ORDINARY_TAINTS = frozenset({"node.kubernetes.io/unschedulable", GPU})


def admin_hold(node: dict) -> str:
    """Why someone other than Regatta took the node out of placement, in
    Kubernetes' words ("" when nothing but Regatta holds it): a cordon
    (`kubectl cordon`/`drain`) Regatta did not make, with the taints and
    reason-like annotations beside it."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if not spec.get("unschedulable") or CORDONED_BY_REGATTA in annotations:
        return ""
    parts = ["cordoned in Kubernetes"]
    for taint in spec.get("taints") or []:
        key = taint.get("key") or ""
        if key in _ORDINARY_TAINTS or key.startswith("node.kubernetes.io/"):
            continue
        value = f"={taint['value']}" if taint.get("value") else ""
        parts.append(f"taint {key}{value}:{taint.get('effect', '')}")
    for key, value in sorted(annotations.items()):
        if any(word in key.lower() for word in ("reason", "cordon", "drain")) and value:
            parts.append(f"{key}: {value}")
    return "; ".join(parts)[:500]


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
        admin_hold=admin_hold(node),
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
    """Health signals one node shows now. A condition, a label or withdrawn
    GPUs are states (`continuous`): the cluster reconcile makes one event of
    each spell it sees, keyed by the state alone, never by the condition's
    lastTransitionTime (kwok, and some agents, leave it unchanged when a
    condition comes back). Ready is not among them: a node not ready is a
    state NodeInfo carries (ready, conditions), and the cluster reconcile
    fails it only past a grace, so a controller-manager's brief
    NodeStatusUnknown after an API server stall retires nothing."""
    name = node["metadata"]["name"]
    signals = []
    for kind, expected in settings.health_conditions.items():
        cond = condition(node, kind)
        if cond is None or cond.get("status") == expected:
            continue
        reason = f"{cond.get('reason', '')} {cond.get('message', '')}".strip()
        signals.append(HealthSignal(
            node=name, kind=_kind_for(reason), severity="critical",
            message=f"{kind}={cond.get('status')}: {reason}"[:500],
            evidence={"condition": cond}, key=f"{name}/{kind}={cond.get('status')}",
            continuous=True,
        ))
    labels = node["metadata"].get("labels") or {}
    for label, healthy in settings.health_labels.items():
        if label in labels and labels[label] != healthy:
            signals.append(HealthSignal(
                node=name, kind=_kind_for(labels[label]), severity="critical",
                message=f"label {label}={labels[label]} (healthy: {healthy})",
                evidence={"label": label, "value": labels[label]},
                key=f"{name}/label/{label}={labels[label]}", continuous=True,
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
            key=f"{name}/gpu-allocatable/{allocatable}-of-{capacity}", continuous=True,
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
