"""A simulated GPU fleet on kwok nodes, and the faults a test can cause.

The nodes look like an EKS GPU node group's: `nvidia.com/gpu` and EFA
capacity, the node group, instance-type, capacity-type and topology labels,
the NVIDIA device plugin's GPU taint, an AWS providerID. kwok's stages bring
their pods to Running (testcluster/stages.py); the functions below change
what a kubelet, the cloud or a termination handler would, through the API.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field

from kubernetes import client as k8s

from .cluster import KWOK_NODE_ANNOTATION
from .stages import (
    FAIL_ANNOTATION,
    FAIL_LABEL,
    NOT_READY_ANNOTATION,
    NOT_READY_LABEL,
    SUCCEED_LABEL,
)

NODEGROUP = "eks.amazonaws.com/nodegroup"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
# Set by AWS Node Termination Handler on a spot interruption notice.
SPOT_ITN_TAINT = "aws-node-termination-handler/spot-itn"


@dataclass(frozen=True)
class Pool:
    name: str
    size: int
    instance_type: str = "p5.48xlarge"
    gpus: int = 8
    efa: int = 32
    cpu: str = "192"
    memory: str = "2048Gi"
    capacity_type: str = "ON_DEMAND"
    zones: tuple[str, ...] = ("us-east-1a",)
    # The NVIDIA device plugin's taint: only pods that ask for GPUs land here.
    taints: tuple[dict, ...] = ({"key": GPU, "value": "true", "effect": "NoSchedule"},)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def selector(self) -> dict[str, str]:
        return {NODEGROUP: self.name}

    def node_name(self, index: int) -> str:
        return f"{self.name}-{index}"


def node_manifest(pool: Pool, index: int) -> dict:
    name = pool.node_name(index)
    zone = pool.zones[index % len(pool.zones)]
    instance = f"i-0{pool.name.encode().hex()[:8]}{index:08x}"
    capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110",
                "ephemeral-storage": "3500Gi", GPU: str(pool.gpus)}
    if pool.efa:
        capacity[EFA] = str(pool.efa)
    # The kubelet reserves some CPU and memory for the system.
    allocatable = dict(capacity, cpu=str(int(pool.cpu) - 1),
                       memory=f"{int(pool.memory.removesuffix('Gi')) - 48}Gi")
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]},
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "type": "kwok",
                "node.kubernetes.io/instance-type": pool.instance_type,
                "topology.kubernetes.io/region": zone[:-1],
                "topology.kubernetes.io/zone": zone,
                NODEGROUP: pool.name,
                "eks.amazonaws.com/capacityType": pool.capacity_type,
                "nvidia.com/gpu.count": str(pool.gpus),
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                **pool.labels,
            },
        },
        "spec": {"providerID": f"aws:///{zone}/{instance}", "taints": list(pool.taints)},
        # As the kubelet registers it: kwok adds no address of its own here.
        "status": {"capacity": capacity, "allocatable": allocatable, "addresses": [
            {"type": "InternalIP", "address": f"10.0.{zlib.crc32(pool.name.encode()) % 250}"
                                              f".{index % 250 + 1}"},
            {"type": "Hostname", "address": name}]},
    }


class Fleet:
    """Makes pools of kwok nodes and causes faults, as the cluster's admin."""

    def __init__(self, api: k8s.ApiClient):
        self.core = k8s.CoreV1Api(api)

    def add(self, pool: Pool) -> list[str]:
        names = []
        for i in range(pool.size):
            body = node_manifest(pool, i)
            self.core.create_node(body)
            names.append(body["metadata"]["name"])
        return names

    def register(self, pool: Pool, name: str, provider_id: str) -> str:
        """The node of one cloud instance of `pool`, as its kubelet registers
        it: named and identified as the cloud says (an Auto Scaling group's
        instance, its private DNS name and `aws:///zone/i-...`)."""
        body = node_manifest(pool, 0)
        body["metadata"]["name"] = name
        body["metadata"]["labels"]["kubernetes.io/hostname"] = name
        body["spec"]["providerID"] = provider_id
        body["status"]["addresses"][1]["address"] = name
        self.core.create_node(body)
        return name

    def ready(self, name: str) -> bool:
        node = self.core.read_node(name)
        return any(c.type == "Ready" and c.status == "True"
                   for c in node.status.conditions or [])

    # --- pods -----------------------------------------------------------------
    def fail_pod(self, namespace: str, pod: str, exit_code: int = 1,
                 reason: str = "Error", message: str = "") -> None:
        """The pod's container exits with `exit_code` (kwok's chaos stage)."""
        # kwok's template writes the reason and message into YAML unquoted, so
        # a message such as "ValueError: …" would not parse: they go quoted.
        annotations = {f"{FAIL_ANNOTATION}/exit-code": str(exit_code),
                       f"{FAIL_ANNOTATION}/reason": json.dumps(reason),
                       f"{FAIL_ANNOTATION}/delay": "0", f"{FAIL_ANNOTATION}/jitter-delay": "0"}
        if message:
            annotations[f"{FAIL_ANNOTATION}/message"] = json.dumps(message)
        self.core.patch_namespaced_pod(pod, namespace, {"metadata": {
            "labels": {FAIL_LABEL: "true"}, "annotations": annotations}})

    def succeed_pod(self, namespace: str, pod: str) -> None:
        """The pod's containers exit 0."""
        self.core.patch_namespaced_pod(pod, namespace,
                                       {"metadata": {"labels": {SUCCEED_LABEL: "true"}}})

    # --- nodes ----------------------------------------------------------------
    def make_not_ready(self, name: str, reason: str = "KubeletNotReady",
                       message: str = "container runtime is down") -> None:
        """The node's Ready condition turns False (kwok's chaos stage); the
        controller-manager's node lifecycle controller then taints it."""
        self.core.patch_node(name, {"metadata": {
            "labels": {NOT_READY_LABEL: "true"},
            "annotations": {f"{NOT_READY_ANNOTATION}/reason": reason,
                            f"{NOT_READY_ANNOTATION}/message": message,
                            f"{NOT_READY_ANNOTATION}/delay": "0",
                            f"{NOT_READY_ANNOTATION}/jitter-delay": "0"}}})

    def taint(self, name: str, key: str = SPOT_ITN_TAINT, value: str = "",
              effect: str = "NoSchedule") -> None:
        """Adds a taint, as a termination handler does on a spot notice."""
        node = self.core.read_node(name)
        taints = [{"key": t.key, "value": t.value, "effect": t.effect}
                  for t in node.spec.taints or [] if t.key != key]
        taints.append({"key": key, "value": value or None, "effect": effect})
        self.core.patch_node(name, {"spec": {"taints": taints}})
