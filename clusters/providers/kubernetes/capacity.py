"""Pods that hold a node's capacity for Regatta: capacity pods that ask
Karpenter for nodes, and standby pods that keep ready spares warm.

Karpenter launches a node only for a pod that is pending for want of one; a
deleted Node with nothing pending is simply gone, so a pool replacing a bad
node would shrink by one each time. Regatta asks for a node with a capacity
pod: a pause container that requests what a training pod of the pool
requests, with the pool's selector and tolerations. Karpenter launches a
node for it; the node joins the pool by its labels (list_nodes), and the pod
keeps it from being consolidated away while it waits for work (pre-warmed
capacity). A launch deletes the capacity pods on the nodes it is placed on,
first, so the training pods get their GPUs.
"""

from __future__ import annotations

import hashlib

from kubernetes import client as k8s

from ..base import PoolInfo
from .config import KubeSettings
from .manifests import (
    DISRUPTION_ANNOTATIONS,
    GPU,
    HOSTNAME,
    LABEL_PURPOSE,
    MANAGED_BY,
    MANAGER,
    _tolerations,
)
from .resources import cpu_memory

PURPOSE = "capacity"
LABEL_POOL = "regatta.io/pool"
# Set on a spare's capacity pod: the name Regatta gave the node it asked for,
# listed as a node not yet ready until Karpenter's node takes the pod.
LABEL_FOR = "regatta.io/capacity-for"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def selector(pool: PoolInfo) -> str:
    return f"{MANAGED_BY}={MANAGER},{LABEL_PURPOSE}={PURPOSE},{LABEL_POOL}={pool.name}"


def pod_name(pool: PoolInfo, key: str) -> str:
    """Stable per (pool, what it stands for): asking twice is one pod."""
    digest = hashlib.sha256(f"{pool.cluster}/{pool.name}/{key}".encode()).hexdigest()[:12]
    return f"regatta-capacity-{digest}"


def capacity_pod(pool: PoolInfo, settings: KubeSettings, key: str, *,
                 spare_name: str = "", avoid: tuple[str, ...] = ()) -> k8s.V1Pod:
    labels = {MANAGED_BY: MANAGER, LABEL_PURPOSE: PURPOSE, LABEL_POOL: pool.name}
    if spare_name:
        labels[LABEL_FOR] = spare_name
    # One per node, like the training pods, and never on a node being retired.
    apart = k8s.V1PodAffinityTerm(topology_key=HOSTNAME, label_selector=k8s.V1LabelSelector(
        match_labels={LABEL_PURPOSE: PURPOSE, LABEL_POOL: pool.name}))
    node_affinity = _hostname(pool, "NotIn", avoid) if avoid else None
    return _holding_pod(
        pool, settings, pod_name(pool, key), labels,
        k8s.V1Container(name="pause", image=PAUSE_IMAGE),
        affinity=k8s.V1Affinity(
            node_affinity=node_affinity,
            pod_anti_affinity=k8s.V1PodAntiAffinity(
                required_during_scheduling_ignored_during_execution=[apart])),
        priority_class=settings.priority_class)


# --- standby pods -----------------------------------------------------------------------
# A ready spare on Kubernetes is a node kept idle for the next failure. Left
# empty, it goes cold in two ways: the scheduler may give its GPUs to another
# pod that tolerates the pool's taints, and the kubelet's image garbage
# collection may remove the trainer image (minutes to pull again, for a CUDA
# image). A standby pod on each ready spare keeps both: it requests what a
# training pod of the pool requests, and runs the trainer image with torch
# and the SDK imported (their files in the node's page cache), then sleeps.
# Its PriorityClass is below the training pods' (deploy/base/
# priorityclass.yaml), so a training pod that lands on the node preempts it;
# a launch deletes the standby pods of its nodes first, so it never waits
# for that. What it cannot do is give its started Python to a rank: the
# PyTorchJob and TrainJob controllers create their own pods
# (docs/kubernetes.md, "Recovery without a cold start").
STANDBY = "standby"
LABEL_STANDBY_FOR = "regatta.io/standby-for"
STANDBY_SCRIPT = (
    "import signal\n"
    "try:\n"
    "    import torch, regatta  # read once, so the rank that comes finds them cached\n"
    "except ImportError:\n"
    "    pass  # an image of the team's own: it is on the node, which is what counts\n"
    "signal.pause()\n")


def standby_selector(pool: PoolInfo) -> str:
    return f"{MANAGED_BY}={MANAGER},{LABEL_PURPOSE}={STANDBY},{LABEL_POOL}={pool.name}"


def standby_name(node: str) -> str:
    """Stable per node: holding a spare twice is one pod."""
    return f"regatta-standby-{hashlib.sha256(node.encode()).hexdigest()[:12]}"


def standby_pod(pool: PoolInfo, settings: KubeSettings, node: str) -> k8s.V1Pod:
    labels = {MANAGED_BY: MANAGER, LABEL_PURPOSE: STANDBY, LABEL_POOL: pool.name,
              LABEL_STANDBY_FOR: node}
    # Bound by the scheduler, not by nodeName, so that it is counted on the
    # node and preempted like any pod of lower priority.
    return _holding_pod(
        pool, settings, standby_name(node), labels,
        k8s.V1Container(name="standby", image=settings.standby_image or settings.preflight_image,
                        command=["python", "-c", STANDBY_SCRIPT]),
        affinity=k8s.V1Affinity(node_affinity=_hostname(pool, "In", (node,))),
        priority_class=settings.standby_priority_class)


def _hostname(pool: PoolInfo, operator: str, names: tuple[str, ...]) -> k8s.V1NodeAffinity:
    return k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
            node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=[
                k8s.V1NodeSelectorRequirement(key=HOSTNAME, operator=operator,
                                              values=sorted(names))])]))


def _holding_pod(pool: PoolInfo, settings: KubeSettings, name: str, labels: dict,
                 container: k8s.V1Container, *, affinity: k8s.V1Affinity,
                 priority_class: str) -> k8s.V1Pod:
    """A pod that holds a node's GPUs, CPU and memory as a training pod of
    the pool would, until a training pod needs them."""
    limits = {GPU: str(pool.gpus_per_node), **cpu_memory(pool, pool.gpus_per_node)}
    container.resources = k8s.V1ResourceRequirements(limits=limits, requests=dict(limits))
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=name, namespace=settings.namespace,
                                  labels=labels, annotations=dict(DISRUPTION_ANNOTATIONS)),
        spec=k8s.V1PodSpec(
            containers=[container],
            # Nothing to save: the GPUs go to a training pod at once.
            termination_grace_period_seconds=0,
            node_selector=dict(pool.node_selector) or None,
            tolerations=_tolerations(pool),
            affinity=affinity,
            priority_class_name=priority_class or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=n)
                                for n in settings.image_pull_secrets] or None,
        ),
    )
