"""Pure functions that build what Regatta sends to Kubernetes.

No I/O here: each function takes a launch request (or a pool and
placements) and the cluster's settings and returns `kubernetes` /
`kubeflow-training` model objects, so tests can check every field and the
round trip through the official models without an API server.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from kubeflow.training import models as kf
from kubernetes import client as k8s
from regatta import contract

from controlplane.lib.errors import PermanentError

from ..base import LaunchRequest, Placement, PoolInfo
from ..program import torchrun_program
from .config import KubeSettings
from .instances import efa_devices
from .resources import cpu_memory

API_VERSION = "kubeflow.org/v1"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
KIND = "PyTorchJob"
# The training operator finds the trainer container by this name.
CONTAINER = "pytorch"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "regatta"
LABEL_JOB = "regatta.io/job-id"
LABEL_ATTEMPT = "regatta.io/attempt-id"
LABEL_PURPOSE = "regatta.io/purpose"  # "attempt" or "preflight"
OPERATOR_JOB_LABEL = "training.kubeflow.org/job-name"
OPERATOR_TYPE_LABEL = "training.kubeflow.org/replica-type"
OPERATOR_INDEX_LABEL = "training.kubeflow.org/replica-index"
HOSTNAME = "kubernetes.io/hostname"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Read back to explain a gang that waits (observe.queue_issues).
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOADS, WORKLOADS_PLURAL = ("kueue.x-k8s.io", "v1beta1"), "workloads"
PODGROUPS, PODGROUPS_PLURAL = ("scheduling.volcano.sh", "v1beta1"), "podgroups"
TOKEN_KEY = "token"
DEFAULT_NCCL_ENV = {"NCCL_DEBUG": "WARN"}
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
# A training pod's node must not be taken away for consolidation or
# scale-down while it runs: losing one node stops the whole gang.
DISRUPTION_ANNOTATIONS = {"karpenter.sh/do-not-disrupt": "true",
                          "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}

_api = k8s.ApiClient()


def to_dict(model: Any) -> dict:
    """The JSON the API server receives for a model object."""
    return _api.sanitize_for_serialization(model)


def from_dict(data: Any, klass: str) -> Any:
    """A `kubernetes`/`kubeflow-training` model from its JSON shape."""
    return _kf_api().deserialize(_Raw(data), klass)


class _Raw:
    def __init__(self, obj):
        self.data = json.dumps(obj)


_kf_client = None


def _kf_api():
    global _kf_client
    if _kf_client is None:
        from kubeflow.training.api_client import ApiClient

        _kf_client = ApiClient()
    return _kf_client


def secret_name(name: str) -> str:
    return f"{name}-token"


def labels_for(job_id: int, attempt_id: int, purpose: str = "attempt") -> dict[str, str]:
    return {
        MANAGED_BY: MANAGER,
        LABEL_JOB: str(job_id),
        LABEL_ATTEMPT: str(attempt_id),
        LABEL_PURPOSE: purpose,
    }


def token_secret(request: LaunchRequest, settings: KubeSettings) -> k8s.V1Secret:
    """The attempt's worker token; pods read it through a secretKeyRef so it
    never appears in the PyTorchJob object."""
    token = request.env.get(contract.TOKEN, "")
    if not token:
        raise PermanentError(f"{request.name}: launch request carries no {contract.TOKEN}")
    return k8s.V1Secret(
        api_version="v1", kind="Secret", type="Opaque",
        metadata=k8s.V1ObjectMeta(
            name=secret_name(request.name), namespace=settings.namespace,
            labels=labels_for(request.job_id, request.attempt_id),
        ),
        string_data={TOKEN_KEY: token},
    )


def owner_reference(job: dict) -> k8s.V1OwnerReference:
    """Makes the secret go when the PyTorchJob goes (garbage collection)."""
    meta = job["metadata"]
    return k8s.V1OwnerReference(
        api_version=API_VERSION, kind=KIND, name=meta["name"], uid=meta["uid"],
        controller=False, block_owner_deletion=False,
    )


def eviction(pod: str, namespace: str, grace_s: int) -> k8s.V1Eviction:
    """Evicts one pod through the Eviction API, so PodDisruptionBudgets hold,
    with the grace period the trainer needs for its emergency checkpoint."""
    return k8s.V1Eviction(
        api_version="policy/v1", kind="Eviction",
        metadata=k8s.V1ObjectMeta(name=pod, namespace=namespace),
        delete_options=k8s.V1DeleteOptions(grace_period_seconds=int(grace_s)),
    )


def nccl_env(pool: PoolInfo, settings: KubeSettings) -> dict[str, str]:
    """Defaults, then the cluster's NCCL settings, then the pool's."""
    env = dict(DEFAULT_NCCL_ENV)
    if pool.efa:
        env.update(EFA_ENV)
    env.update(settings.nccl_env)
    env.update(pool.settings.nccl_env)
    return env


def pytorch_job(request: LaunchRequest, settings: KubeSettings,
                allocatable: dict | None = None) -> kf.KubeflowOrgV1PyTorchJob:
    """The PyTorchJob for one attempt: a Master on the first placement and
    Workers on the rest, one pod per node, each pinned to its chosen node.
    `allocatable` is the smallest placed node's (resources.py), if known."""
    if not request.placements:
        raise PermanentError(f"{request.name}: no placements")
    placements = sorted(request.placements, key=lambda p: p.node_rank)
    pod = _attempt_pod(request, settings, allocatable)
    replicas = {"Master": _replica(pod, [placements[0].node], 1)}
    if len(placements) > 1:
        replicas["Worker"] = _replica(pod, [p.node for p in placements[1:]], len(placements) - 1)
    return _job(request.name, pod.labels, settings, replicas, str(request.nproc_per_node),
                len(placements))


def attempt_pod_template(request: LaunchRequest, settings: KubeSettings,
                         allocatable: dict | None = None, *,
                         peer_label: str) -> k8s.V1PodTemplateSpec:
    """The pod every node of an attempt runs, placed on any of the chosen
    nodes (one pod per node), for a workload whose pods share one template
    (a TrainJob's JobSet, trainjob.py). `peer_label` is the label the
    workload's controller puts on all of the attempt's pods, which keeps
    them apart."""
    if not request.placements:
        raise PermanentError(f"{request.name}: no placements")
    pod = _attempt_pod(request, settings, allocatable, peer_label=peer_label)
    nodes = [p.node for p in request.placements]
    return _replica(pod, nodes, len(nodes)).template


def _attempt_pod(request: LaunchRequest, settings: KubeSettings, allocatable: dict | None,
                 peer_label: str = OPERATOR_JOB_LABEL) -> _PodParts:
    placements = request.placements
    labels = labels_for(request.job_id, request.attempt_id)
    env = _trainer_env(request, settings)
    # torchrun SIGKILLs its ranks 30 s after a SIGTERM unless told otherwise;
    # the pod's grace period is what must bound the emergency checkpoint.
    # `--` ends torchrun's options: nothing of the program's is read as one.
    command = ["torchrun", f"--shutdown-timeout={int(settings.termination_grace_s)}",
               *torchrun_program(request.command)]
    volumes, mounts = _checkpoint_volume(request.checkpoint_uri, settings)
    shm_volumes, shm_mounts = _shm(settings)
    return _PodParts(
        name=request.name, labels=labels, image=request.image, command=command, env=env,
        gpus=request.pool.gpus_per_node, pool=request.pool, settings=settings,
        service_account=_service_account(request, settings),
        volumes=volumes + shm_volumes, mounts=mounts + shm_mounts,
        cpu_memory=cpu_memory(request.pool, request.pool.gpus_per_node, allocatable),
        annotations=dict(DISRUPTION_ANNOTATIONS),
        # A node the attempt was placed on is never one to avoid.
        avoid=tuple(sorted(set(request.avoid_nodes) - {p.node for p in placements})),
        pin=False, peer_label=peer_label,
    )


def preflight_name(placements: tuple[Placement, ...], nonce: str) -> str:
    """Names differ per run, so a finished check is never mistaken for a new one."""
    nodes = ",".join(sorted(p.node for p in placements))
    digest = hashlib.sha256(f"{nodes}|{nonce}".encode()).hexdigest()[:16]
    return f"regatta-preflight-{digest}"


# Each pod is one node's rank (nprocPerNode=1), so WORLD_SIZE and RANK from the
# operator are the node count and the node's index: no torchrun needed.
PREFLIGHT_SCRIPT = """
import json, time, torch, torch.distributed as dist
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
n = dist.get_world_size()
dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
x = torch.ones(64 << 20 if cuda else 1 << 20, device=dev)
def once():
    dist.all_reduce(x)
    x.div_(n)  # a sum of n ones is exact, so x stays all ones if every rank took part
once()
if cuda: torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(5): once()
if cuda: torch.cuda.synchronize()
s = (time.perf_counter() - t) / 5
ok = bool(torch.all(x == 1))
gbps = x.numel() * x.element_size() * 2 * (n - 1) / n / s / 1e9
print(json.dumps({"rank": dist.get_rank(), "ok": ok, "busbw_gbps": round(gbps, 3)}))
dist.destroy_process_group()
raise SystemExit(0 if ok else 3)
"""


def _preflight_pod(pool: PoolInfo, placements: tuple[Placement, ...],
                   settings: KubeSettings, name: str, command: list[str],
                   peer_label: str) -> _PodParts:
    """The preflight's pod: one per chosen node, on exactly those nodes."""
    labels = {MANAGED_BY: MANAGER, LABEL_PURPOSE: "preflight"}
    return _PodParts(
        name=name, labels=labels, image=settings.preflight_image, command=command,
        env=[_env(k, v) for k, v in sorted(nccl_env(pool, settings).items())],
        gpus=pool.gpus_per_node, pool=pool, settings=settings,
        service_account=settings.service_account, volumes=[], mounts=[],
        # A few seconds' check: no QoS to keep, nothing a consolidation would cost.
        cpu_memory={}, annotations=None, avoid=(), pin=True, peer_label=peer_label,
    )


def preflight_job(pool: PoolInfo, placements: tuple[Placement, ...],
                  settings: KubeSettings, nonce: str) -> kf.KubeflowOrgV1PyTorchJob:
    """A short all-reduce across the chosen nodes, one pod per node."""
    if not placements:
        raise PermanentError("preflight needs at least one placement")
    placements = tuple(sorted(placements, key=lambda p: p.node_rank))
    name = preflight_name(placements, nonce)
    pod = _preflight_pod(pool, placements, settings, name,
                         ["python", "-c", PREFLIGHT_SCRIPT], OPERATOR_JOB_LABEL)
    replicas = {"Master": _replica(pod, [placements[0].node], 1)}
    if len(placements) > 1:
        replicas["Worker"] = _replica(pod, [p.node for p in placements[1:]], len(placements) - 1)
    job = _job(name, pod.labels, settings, replicas, "1", len(placements))
    # A preflight that cannot finish in a few minutes has found its answer, and
    # the operator removes one left behind by a worker that crashed meanwhile.
    job.spec.run_policy.active_deadline_seconds = PREFLIGHT_DEADLINE_S
    job.spec.run_policy.ttl_seconds_after_finished = 300
    return job


PREFLIGHT_DEADLINE_S = 300


def preflight_pod_template(pool: PoolInfo, placements: tuple[Placement, ...],
                           settings: KubeSettings, name: str,
                           peer_label: str) -> k8s.V1PodTemplateSpec:
    """The preflight's pod for a workload whose pods share one template (a
    TrainJob, trainjob.py): under torchrun, which takes its rendezvous from
    the PET_* variables the workload's controller sets (one process per
    node), then runs the same script as the PyTorchJob's pods."""
    if not placements:
        raise PermanentError("preflight needs at least one placement")
    command = ["torchrun", "--no-python", "python", "-c", PREFLIGHT_SCRIPT]
    pod = _preflight_pod(pool, placements, settings, name, command, peer_label)
    nodes = [p.node for p in placements]
    return _replica(pod, nodes, len(nodes)).template


# --- parts -------------------------------------------------------------------

class _PodParts:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _job(name, labels, settings, replicas, nproc, node_count) -> kf.KubeflowOrgV1PyTorchJob:
    job_labels = dict(labels)
    scheduling = None
    if settings.gang_scheduler == "kueue":
        job_labels[KUEUE_QUEUE_LABEL] = settings.queue
    elif settings.gang_scheduler == "volcano":
        scheduling = kf.KubeflowOrgV1SchedulingPolicy(
            min_available=node_count, queue=settings.queue,
            priority_class=settings.priority_class or None,
        )
    return kf.KubeflowOrgV1PyTorchJob(
        api_version=API_VERSION, kind=KIND,
        metadata=k8s.V1ObjectMeta(name=name, namespace=settings.namespace, labels=job_labels),
        spec=kf.KubeflowOrgV1PyTorchJobSpec(
            nproc_per_node=nproc,
            pytorch_replica_specs=replicas,
            run_policy=kf.KubeflowOrgV1RunPolicy(
                # Regatta owns restarts (budgets per failure class): with the
                # replicas' restartPolicy Never the operator restarts nothing,
                # and cleanPodPolicy None keeps the pods to read exit codes.
                # No backoffLimit: with one set (even 0), the training-operator
                # (v1.9) deletes every pod of the job on its first failure,
                # before it marks the job Failed, cleanPodPolicy or not, and
                # the exit code goes with them (kubernetes/test_real_cluster.py,
                # test_a_rank_that_exits_with_an_error_fails_the_job_at_once).
                clean_pod_policy="None", scheduling_policy=scheduling,
            ),
        ),
    )


def _replica(pod: _PodParts, nodes: list[str], count: int) -> kf.KubeflowOrgV1ReplicaSpec:
    settings: KubeSettings = pod.settings
    pool: PoolInfo = pod.pool
    limits = {GPU: str(pod.gpus), **pod.cpu_memory}
    if pool.efa:
        limits[EFA] = str(pool.settings.efa_devices or efa_devices(pool.instance_type))
    container = k8s.V1Container(
        name=CONTAINER, image=pod.image, command=pod.command, env=pod.env,
        resources=k8s.V1ResourceRequirements(limits=limits, requests=dict(limits)),
        volume_mounts=pod.mounts or None,
        termination_message_policy="FallbackToLogsOnError",
    )
    spec = k8s.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        termination_grace_period_seconds=settings.termination_grace_s,
        node_selector=dict(pool.node_selector) or None,
        tolerations=_tolerations(pool),
        affinity=_affinity(pod.name, nodes, pool, pod.avoid, pod.pin, pod.peer_label),
        volumes=pod.volumes or None,
        service_account_name=pod.service_account or None,
        scheduler_name="volcano" if settings.gang_scheduler == "volcano" else None,
        priority_class_name=settings.priority_class or None,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=n)
                            for n in settings.image_pull_secrets] or None,
    )
    return kf.KubeflowOrgV1ReplicaSpec(
        replicas=count, restart_policy="Never",
        template=k8s.V1PodTemplateSpec(
            metadata=k8s.V1ObjectMeta(labels=dict(pod.labels),
                                      annotations=pod.annotations),
            spec=spec,
        ),
    )


def _affinity(name: str, nodes: list[str], pool: PoolInfo, avoid: tuple[str, ...] = (),
              pin: bool = False, peer_label: str = OPERATOR_JOB_LABEL) -> k8s.V1Affinity:
    """`pin`: on exactly `nodes` whatever the pool (a preflight checks those)."""
    # One pod per node, so Workers spread over exactly as many nodes.
    apart = k8s.V1PodAffinityTerm(
        topology_key=HOSTNAME,
        label_selector=k8s.V1LabelSelector(match_labels={peer_label: name}),
    )
    if pool.settings.node_autoscaler == "karpenter" and not pin:
        node_affinity = _pool_affinity(nodes, avoid)
    else:
        pin = k8s.V1NodeSelectorTerm(match_expressions=[
            k8s.V1NodeSelectorRequirement(key=HOSTNAME, operator="In", values=sorted(nodes)),
        ])
        node_affinity = k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[pin]))
    return k8s.V1Affinity(
        node_affinity=node_affinity,
        pod_anti_affinity=k8s.V1PodAntiAffinity(
            required_during_scheduling_ignored_during_execution=[apart],
        ),
    )


def _pool_affinity(nodes: list[str], avoid: tuple[str, ...]) -> k8s.V1NodeAffinity | None:
    """A Karpenter pool: any node of the pool (its nodeSelector) except those
    out of service, the chosen ones preferred. Karpenter does not provision
    for a pod pinned to hostnames that no longer exist, so a hard pin would
    leave a relaunch pending forever after a node is replaced."""
    required = None
    if avoid:
        required = k8s.V1NodeSelector(node_selector_terms=[k8s.V1NodeSelectorTerm(
            match_expressions=[k8s.V1NodeSelectorRequirement(
                key=HOSTNAME, operator="NotIn", values=list(avoid))])])
    preferred = [k8s.V1PreferredSchedulingTerm(weight=100, preference=k8s.V1NodeSelectorTerm(
        match_expressions=[k8s.V1NodeSelectorRequirement(
            key=HOSTNAME, operator="In", values=sorted(nodes))]))]
    return k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=required,
        preferred_during_scheduling_ignored_during_execution=preferred)


def _tolerations(pool: PoolInfo) -> list[k8s.V1Toleration]:
    raw = [dict(t) for t in pool.tolerations]
    if not any(t.get("key") == GPU for t in raw):
        raw.append(dict(GPU_TOLERATION))
    try:
        return [from_dict(t, "V1Toleration") for t in raw]
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"pool {pool.name}: bad toleration: {exc}") from exc


def _env(name: str, value: str) -> k8s.V1EnvVar:
    # An empty value is left out, as Go's types write it (`omitempty`): a
    # controller that updates a TrainJob through them (Kueue, admitting it)
    # would otherwise change `spec.trainer`, which the Trainer's CRD keeps
    # immutable, and be refused.
    return k8s.V1EnvVar(name=name, value=str(value) or None)


def _trainer_env(request: LaunchRequest, settings: KubeSettings) -> list[k8s.V1EnvVar]:
    values = dict(nccl_env(request.pool, settings))
    # The trainer contract wins over NCCL defaults of the same name.
    values.update({k: str(v) for k, v in request.env.items()})
    if request.checkpoint_uri:
        values[contract.CHECKPOINT_URI] = _pod_checkpoint_uri(request.checkpoint_uri)
    if values.get(contract.CHECKPOINT_URI, "").startswith("s3://"):
        # Credentials come from the pod's service account (IRSA), never from here.
        if settings.region:
            values.setdefault("AWS_DEFAULT_REGION", settings.region)
        if settings.s3_endpoint_url:
            values.setdefault("AWS_ENDPOINT_URL_S3", settings.s3_endpoint_url)
    values.pop(contract.TOKEN, None)
    values.pop(contract.NODE, None)
    # Each rank's status file would be lost with its pod; exit codes are read
    # from the pod instead.
    values.pop(contract.STATUS_DIR, None)
    env = [_env(k, v) for k, v in sorted(values.items())]
    env.append(k8s.V1EnvVar(name=contract.TOKEN, value_from=k8s.V1EnvVarSource(
        secret_key_ref=k8s.V1SecretKeySelector(name=secret_name(request.name), key=TOKEN_KEY),
    )))
    env.append(k8s.V1EnvVar(name=contract.NODE, value_from=k8s.V1EnvVarSource(
        field_ref=k8s.V1ObjectFieldSelector(field_path="spec.nodeName"),
    )))
    return env


def _pod_checkpoint_uri(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _service_account(request: LaunchRequest, settings: KubeSettings) -> str:
    """The team's own service account where the cluster names one per team
    (its IAM role reaches only the team's S3 prefix); a team left out of
    that list is refused rather than given the shared account."""
    accounts = settings.team_service_accounts
    if not accounts:
        return settings.service_account
    if request.team not in accounts:
        raise PermanentError(
            f"team {request.team!r} has no service account in the cluster's "
            "team_service_accounts; an operator must add one before it can launch here")
    return accounts[request.team]


def _checkpoint_volume(uri: str, settings: KubeSettings):
    """S3 needs nothing mounted; a path needs the shared volume (FSx for
    Lustre, EFS, NFS) at the same path the control plane reads. Only the
    job's own folder is mounted (a subPath of the volume): the whole volume
    would let every rank read and overwrite every team's checkpoints. An
    eval run's folder is its parent's, which it reads."""
    if not uri or uri.startswith("s3://"):
        return [], []
    path = posixpath.normpath(_pod_checkpoint_uri(uri))
    if not settings.checkpoint_pvc:
        raise PermanentError(
            f"checkpoint URI {uri!r} is a path but the cluster has no 'checkpoint_pvc'; "
            "set one or use an s3:// storage URI"
        )
    mount = settings.checkpoint_mount_path.rstrip("/") or "/"
    if not path.startswith(mount.rstrip("/") + "/"):
        raise PermanentError(
            f"checkpoint path {path!r} is not a folder inside checkpoint_mount_path {mount!r}"
        )
    volume = k8s.V1Volume(
        name="checkpoints",
        persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
            claim_name=settings.checkpoint_pvc),
    )
    # The kubelet makes the folder on the volume if it is not there yet.
    return [volume], [k8s.V1VolumeMount(name="checkpoints", mount_path=path,
                                        sub_path=posixpath.relpath(path, mount))]


def _shm(settings: KubeSettings):
    # Dataloader workers and NCCL share memory through /dev/shm, which is 64 MiB
    # in a container unless a memory-backed volume replaces it.
    if not settings.shm_size:
        return [], []
    volume = k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(
        medium="Memory", size_limit=settings.shm_size))
    return [volume], [k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
