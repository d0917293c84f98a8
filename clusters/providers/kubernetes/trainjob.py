"""Attempts as Kubeflow Trainer v2 TrainJobs (cluster setting `job_api:
trainjob`): what Regatta sends, and how it reads back what the Trainer, the
JobSet controller and the Job controller made of it. Pure functions; the
calls are in client.py.

A TrainJob names a ClusterTrainingRuntime (Regatta's ships in
deploy/trainjob/): torch distributed, one replicated Job `node` of
`numNodes` indexed pods, restarts off. Everything particular to the attempt
goes in the TrainJob itself: image, command and environment in `trainer`,
the pod's placement, volumes, labels and service account in a runtime patch
of the pod template. That pod is the one manifests.py builds for a
PyTorchJob's replicas, so both APIs run the same pod.
"""

from __future__ import annotations

from kubernetes import client as k8s

from ..base import AttemptStatus, LaunchRequest, NodeProcess, Placement, PoolInfo, StartIssue
from . import manifests as mf
from .config import KubeSettings
from .observe import (
    attempt_status_of,
    ended_by,
    node_process,
    pod_issues,
    queue_issues,
    taken_back,
)

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
# The runtime's replicated Job and its trainer container, by the names the
# Trainer's torch plugin looks for (it injects the PET_* rendezvous there).
REPLICATED_JOB = "node"
CONTAINER = "node"
# Whose runtime patch this is; the Trainer keeps patches apart by manager.
PATCH_MANAGER = "regatta.io/launcher"
# Put by the JobSet controller on every pod of the JobSet, which is named
# after the TrainJob; and by the Job controller, the pod's index, which the
# torch plugin makes the node rank (PET_NODE_RANK).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Pod spec fields a runtime patch may set (Trainer v2.3's PodSpecPatch).
_PATCHABLE = ("serviceAccountName", "volumes", "imagePullSecrets", "nodeSelector", "affinity",
              "tolerations", "terminationGracePeriodSeconds")


def train_job(request: LaunchRequest, settings: KubeSettings,
              allocatable: dict | None = None) -> dict:
    """The TrainJob for one attempt: `numNodes` pods, one per chosen node."""
    template = mf.to_dict(mf.attempt_pod_template(request, settings, allocatable,
                                                  peer_label=JOBSET_NAME_LABEL))
    return _train_job(request.name, mf.labels_for(request.job_id, request.attempt_id),
                      settings, template, len(request.placements), request.nproc_per_node)


def preflight_train_job(pool: PoolInfo, placements: tuple[Placement, ...],
                        settings: KubeSettings, nonce: str) -> dict:
    """The all-reduce preflight (manifests.PREFLIGHT_SCRIPT) as a TrainJob
    against the same runtime: one pod per chosen node, one process each."""
    name = mf.preflight_name(placements, nonce)
    template = mf.to_dict(mf.preflight_pod_template(pool, placements, settings, name,
                                                    peer_label=JOBSET_NAME_LABEL))
    job = _train_job(name, template["metadata"]["labels"], settings, template,
                     len(placements), 1)
    # A check that cannot finish in a few minutes has found its answer.
    job["spec"]["activeDeadlineSeconds"] = mf.PREFLIGHT_DEADLINE_S
    return job


def _train_job(name: str, labels: dict, settings: KubeSettings, template: dict,
               nodes: int, nproc_per_node: int) -> dict:
    """A TrainJob against the cluster's runtime: the pod's container in
    `trainer`, the rest of the pod in a runtime patch of the `node` Job."""
    spec = template["spec"]
    (container,) = spec["containers"]
    job_labels = dict(labels)
    if settings.gang_scheduler == "kueue":
        job_labels[mf.KUEUE_QUEUE_LABEL] = settings.queue
    pod_patch = {k: spec[k] for k in _PATCHABLE if k in spec}
    if container.get("volumeMounts"):
        pod_patch["containers"] = [{"name": CONTAINER, "volumeMounts": container["volumeMounts"]}]
    replicated = {"name": REPLICATED_JOB, "template": {"spec": {"template": {
        "metadata": template["metadata"], "spec": pod_patch}}}}
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": name, "namespace": settings.namespace, "labels": job_labels},
        "spec": {
            "runtimeRef": {"name": settings.training_runtime, "apiGroup": GROUP,
                           "kind": "ClusterTrainingRuntime"},
            # No empty `env`: Go's types leave it out (omitempty), and Kueue
            # updates a TrainJob through them, where spec.trainer is immutable.
            "trainer": {
                "image": container["image"], "command": container["command"],
                **({"env": container["env"]} if container.get("env") else {}),
                "numNodes": nodes, "numProcPerNode": nproc_per_node,
                "resourcesPerNode": container["resources"],
            },
            "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {
                "template": {"spec": {"replicatedJobs": [replicated]}}}}],
        },
    }


def finished(job: dict | None) -> bool:
    return _true(job, "Complete") or _true(job, "Failed")


def owner_reference(job: dict) -> k8s.V1OwnerReference:
    """Makes the token Secret go when the TrainJob goes."""
    meta = job["metadata"]
    return k8s.V1OwnerReference(api_version=API_VERSION, kind=KIND, name=meta["name"],
                                uid=meta["uid"], controller=False, block_owner_deletion=False)


def pods_selector(name: str) -> str:
    return f"{JOBSET_NAME_LABEL}={name}"


# --- observe -----------------------------------------------------------------

def _condition(obj: dict | None, kind: str) -> dict | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return None


def _true(obj: dict | None, kind: str) -> bool:
    cond = _condition(obj, kind)
    return bool(cond) and cond.get("status") == "True"


def rank_of(pod: dict) -> int | None:
    """A pod's node rank: its Job completion index."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    try:
        return int(labels.get(COMPLETION_INDEX_LABEL, ""))
    except ValueError:
        return None


def _newest_by_rank(pods: list[dict]) -> dict[int, dict]:
    """One pod per rank: the newest, should a JobSet restart have made its Jobs again."""
    by_rank: dict[int, dict] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        rank = rank_of(pod)
        if rank is not None:
            by_rank[rank] = pod
    return by_rank


def suspended(job: dict) -> bool:
    """A TrainJob its gang scheduler (Kueue) holds or took back."""
    return bool((job.get("spec") or {}).get("suspend"))


def started(jobset: dict | None) -> bool:
    """Whether the JobSet's Jobs have made their pods: from then on a rank
    whose pod is missing has lost it."""
    for status in ((jobset or {}).get("status") or {}).get("replicatedJobsStatus") or []:
        if any(status.get(k) for k in ("active", "ready", "succeeded", "failed")):
            return True
    return False


def attempt_status(job: dict | None, jobset: dict | None, pods: list[dict],
                   placements: list[dict], *, workload: dict | None = None,
                   own_secret: str = "", lost: dict[int, NodeProcess] | None = None,
                   refused: list[StartIssue] | None = None) -> AttemptStatus:
    """The TrainJob's attempt as the provider protocol sees it, the same as a
    PyTorchJob's (observe.attempt_status): `placements` is the ref's
    [{"node", "node_rank"}]. The Job controller may give any index to any
    chosen node; each rank is reported on the node its pod runs on."""
    if job is None:
        return AttemptStatus(state="unknown", message="the TrainJob no longer exists")
    why = taken_back(suspended(job), workload)
    if why:
        return AttemptStatus(state="failed", nodes=ended_by(placements, why), message=why,
                             taken_back=why)
    gang_failed = _true(job, "Failed") or _true(jobset, "Failed")
    by_rank = _newest_by_rank(pods)
    nodes, notes, issues = [], [], []
    for place in sorted(placements, key=lambda p: p["node_rank"]):
        rank = place["node_rank"]
        pod = by_rank.get(rank)
        if rank in (lost or {}):
            nodes.append(lost[rank])
            continue
        if pod is not None:
            nodes.append(node_process(pod, rank, place["node"], container=CONTAINER))
            issues.extend(pod_issues(pod, rank, own_secret))
            continue
        if gang_failed:
            # With restarts off, the Job controller deletes a failed Job's
            # other running pods: this rank ended because another failed,
            # which is no evidence against its node.
            nodes.append(NodeProcess(node=place["node"], node_rank=rank, running=False,
                                     log_tail="its pod was removed when the gang failed"))
        elif started(jobset) and not refused:
            nodes.append(NodeProcess(node=place["node"], node_rank=rank, running=False,
                                     signal=9, log_tail="its pod is gone"))
        else:
            nodes.append(NodeProcess(node=place["node"], node_rank=rank, running=True))
    for obj, kinds in ((job, ("Failed", "Complete", "Suspended")),
                       (jobset, ("Failed", "Completed"))):
        for kind in kinds:
            cond = _condition(obj, kind)
            if cond and cond.get("status") == "True":
                notes.append(f"{obj['kind']} {kind}: {cond.get('message') or cond.get('reason')}")
    state = ("failed" if gang_failed else "succeeded" if _true(job, "Complete") else "running")
    if state == "running" and not started(jobset):
        # Kueue holds a TrainJob back by suspending it, as it does a PyTorchJob.
        issues[:0] = queue_issues(job, workload, None)
    if state == "running" and len(by_rank) < len(placements):
        # Why the Job controller (or JobSet's, or Kueue) made no pod, in the
        # API server's words: a wait, not a hang.
        issues.extend(refused or ())
    return attempt_status_of(state, nodes, notes, issues)
