"""Per-cluster and per-pool Kubernetes settings, checked once.

Every key is documented in docs/kubernetes.md. A bad value raises
SettingsError naming the key when the cluster is saved (clusters/settings.py),
and a PermanentError at run time, so a typo never retries forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controlplane.lib.errors import PermanentError
from controlplane.lib.typed_settings import SettingsError, parse, setting

PREFLIGHT_MODES = ("allreduce", "dcgm-labels")
GANG_SCHEDULERS = ("", "volcano", "kueue")
PROPAGATION = ("Foreground", "Background")
# What an attempt is made as: a Kubeflow PyTorchJob (training-operator v1),
# or a TrainJob (Kubeflow Trainer v2, run by JobSet) against the
# ClusterTrainingRuntime named by `training_runtime` (deploy/trainjob/).
JOB_APIS = ("pytorchjob", "trainjob")
# Pool setting `node_autoscaler`: what brings up a machine behind a node. Only
# an autoscaler that terminates the instance when its Node object is deleted,
# and launches capacity anew (Karpenter), may be asked for a replacement by a
# Node delete alone; see replace_mode.
NODE_AUTOSCALERS = ("", "karpenter")
# EKS's node monitoring agent runs NVIDIA DCGM checks and reports them here.
DEFAULT_HEALTH_CONDITIONS = {"AcceleratedHardwareReady": "True"}


def _mode(value):
    # The job reconciler reads the same key as on/off (clusters/settings.py):
    # true is the default mode here; false turns the check off there.
    return PREFLIGHT_MODES[0] if isinstance(value, bool) else value


@dataclass(frozen=True)
class KubeSettings:
    """A Kubernetes cluster's own settings (docs/kubernetes.md)."""

    namespace: str = setting("regatta-training", "namespace the PyTorchJobs run in")
    job_api: str = setting("pytorchjob", "pytorchjob (Kubeflow v1) or trainjob (Trainer v2)",
                           choices=JOB_APIS)
    training_runtime: str = setting("regatta-torch-distributed",
                                    "the ClusterTrainingRuntime of TrainJobs (job_api trainjob)")
    # How to reach the API server: in-cluster service account, a kubeconfig
    # (and context), or a plain URL without auth (kubectl proxy).
    in_cluster: bool = setting(False, "use the pod's service account")
    kubeconfig: str = setting("", "path of a kubeconfig file")
    context: str = setting("", "kubeconfig context")
    api_url: str = setting("", "API server URL without auth (kubectl proxy)")
    request_timeout_s: float = setting(30.0, "timeout of one API request", minimum=0)
    service_account: str = setting("", "service account of the training pods")
    # One IAM identity for every team would let any rank read every team's
    # S3 checkpoints: per-team accounts, each with a role (IRSA) or Pod
    # Identity session tags scoped to the team's prefix (docs/aws.md).
    team_service_accounts: dict[str, str] = setting(
        {}, "service account of each team's training pods (team name: account); once "
        "set, a team not listed cannot launch here")
    image_pull_secrets: tuple[str, ...] = setting((), "image pull secret names")
    nccl_env: dict[str, str] = setting({}, "NCCL_* variables for every rank")
    checkpoint_pvc: str = setting("", "PVC mounted for file checkpoints")
    checkpoint_mount_path: str = setting("/checkpoints", "where the PVC is mounted")
    shm_size: str = setting("", "size of /dev/shm, e.g. 64Gi")
    gang_scheduler: str = setting("", "volcano or kueue", choices=GANG_SCHEDULERS)
    queue: str = setting("", "Volcano queue or Kueue LocalQueue")
    priority_class: str = setting("", "PriorityClass of the training pods")
    # Goes into an integer pod field (terminationGracePeriodSeconds), which the
    # API server rejects as a float.
    termination_grace_s: int = setting(120, "pods' termination grace, seconds", minimum=0)
    delete_propagation: str = setting("Foreground", "how a PyTorchJob is deleted",
                                      choices=PROPAGATION)
    preflight: str = setting("allreduce", "allreduce or dcgm-labels", choices=PREFLIGHT_MODES,
                             normalize=_mode)
    preflight_image: str = setting("regatta/trainer:latest", "image of the preflight pods")
    # A standby pod on each ready spare (capacity.py): the node's GPUs held
    # for Regatta and the trainer image kept on it. Not on Karpenter pools,
    # whose spares their capacity pods hold already.
    standbys: bool = setting(True, "keep a standby pod on each ready spare")
    standby_image: str = setting("", "image of the standby pods (default: preflight_image)")
    standby_priority_class: str = setting(
        "regatta-standby", "PriorityClass of the standby pods, below the training pods'")
    health_conditions: dict[str, str] = setting(
        DEFAULT_HEALTH_CONDITIONS, "Node conditions with the value that means healthy")
    # Node labels a health checker sets, with the value that means healthy.
    health_labels: dict[str, str] = setting({}, "Node labels with the value that means healthy")
    # Shared with the AWS adapter and checkpoint storage (clusters/settings.py
    # reads them too); handed to the ranks when checkpoints go to S3.
    region: str = setting("", "AWS region")
    s3_endpoint_url: str = setting("", "S3 endpoint, e.g. a local moto server")
    aws_profile: str = setting("", "AWS credentials profile for node replacement")
    endpoint_url: str = setting("", "AWS API endpoint for node replacement")

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> KubeSettings:
        settings = parse(cls, raw)
        if not settings.namespace:
            raise SettingsError("cluster", {"namespace": "must not be empty"})
        if settings.gang_scheduler and not settings.queue:
            raise SettingsError("cluster", {"queue": f"is needed with {settings.gang_scheduler}"})
        if settings.job_api == "trainjob":
            _check_trainjob(settings)
        return settings


def _check_trainjob(settings: KubeSettings) -> None:
    """What a TrainJob cannot carry, refused when the cluster is saved rather
    than dropped at launch (docs/kubernetes.md, "Trainer v2")."""
    errors = {}
    if not settings.training_runtime:
        errors["training_runtime"] = "must name a ClusterTrainingRuntime with job_api trainjob"
    if settings.gang_scheduler == "volcano":
        errors["gang_scheduler"] = ("volcano is not supported with job_api trainjob yet "
                                    "(the runtime's podGroupPolicy would carry it)")
    if settings.priority_class:
        errors["priority_class"] = ("a TrainJob's runtimePatches cannot set it: set "
                                    "priorityClassName in the ClusterTrainingRuntime instead")
    if errors:
        raise SettingsError("cluster", errors)


@dataclass(frozen=True)
class KubePoolSettings:
    """A Kubernetes pool's own settings (docs/kubernetes.md, docs/aws.md)."""

    asg_name: str = setting("", "the managed node group's Auto Scaling group")
    node_autoscaler: str = setting("", "karpenter, or empty", choices=NODE_AUTOSCALERS)
    # 0: every EFA interface of the instance type (instances.py: 32 on a p5).
    efa_devices: int = setting(0, "EFA devices each rank's pod requests; 0: the instance "
                               "type's count", minimum=0)
    # Guaranteed QoS (requests = limits for CPU and memory) keeps training pods
    # from being the first evicted under node memory pressure. Per GPU; empty:
    # derived from the node's allocatable (or the instance type) less headroom
    # for the node's DaemonSets.
    cpu_per_gpu: str = setting("", "CPU each GPU's share of a pod requests, e.g. 22")
    memory_per_gpu: str = setting("", "memory each GPU's share of a pod requests, e.g. 230Gi")
    daemonset_headroom: float = setting(
        0.1, "share of a node's allocatable CPU/memory left to its DaemonSets", minimum=0)
    guaranteed_qos: bool = setting(True, "request CPU and memory equal to their limits")
    nccl_env: dict[str, str] = setting({}, "NCCL_* variables for this pool's ranks")
    # Read and ignored: replacement no longer waits for the group's new
    # instance (a later pass lists it). Kept so pools that set them still load.
    replace_timeout_s: float = setting(300.0, "ignored (replacement does not wait)", minimum=0)
    replace_poll_s: float = setting(5.0, "ignored (replacement does not wait)", minimum=0)
    spot_queue_url: str = setting("", "SQS queue of EC2 spot interruption notices")
    spot_foreign_visibility_s: int = setting(
        20, "seconds another cluster's notice stays hidden", minimum=0)
    # A queue shared with other clusters holds their notices too; a sweep
    # reads until the queue shows nothing new, up to this many batches of ten.
    spot_max_batches: int = setting(50, "SQS receive calls per pass, at most", minimum=1)


def replace_mode(pool_name: str, pool_settings: KubePoolSettings) -> str:
    """How a pool's node is replaced: "asg" (terminate the instance through
    its Auto Scaling group, then delete the Node) or "node-delete" (Karpenter
    terminates and replaces what it launched). Deleting the Node of an EKS
    managed node group does neither: its kubelet registers the same instance
    again, so a pool with neither setting cannot replace nodes at all."""
    autoscaler = pool_settings.node_autoscaler
    asg = pool_settings.asg_name
    if asg and autoscaler:
        raise PermanentError(
            f"pool {pool_name}: 'asg_name' and 'node_autoscaler': {autoscaler!r} contradict; "
            "Karpenter launches instances outside any Auto Scaling group")
    if asg:
        return "asg"
    if autoscaler:
        return "node-delete"
    raise PermanentError(
        f"pool {pool_name}: replacing a node needs 'asg_name' (a managed node group's Auto "
        "Scaling group) or 'node_autoscaler': 'karpenter'; deleting the Node of a managed "
        "node group only makes its kubelet register the same instance again")
