"""Capacity for a Karpenter pool, asked for the way Karpenter understands.

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
    limits = {GPU: str(pool.gpus_per_node), **cpu_memory(pool, pool.gpus_per_node)}
    # One per node, like the training pods, and never on a node being retired.
    apart = k8s.V1PodAffinityTerm(topology_key=HOSTNAME, label_selector=k8s.V1LabelSelector(
        match_labels={LABEL_PURPOSE: PURPOSE, LABEL_POOL: pool.name}))
    node_affinity = None
    if avoid:
        node_affinity = k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=[
                    k8s.V1NodeSelectorRequirement(key=HOSTNAME, operator="NotIn",
                                                  values=sorted(avoid))])]))
    return k8s.V1Pod(
        api_version="v1", kind="Pod",
        metadata=k8s.V1ObjectMeta(name=pod_name(pool, key), namespace=settings.namespace,
                                  labels=labels, annotations=dict(DISRUPTION_ANNOTATIONS)),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(
                name="pause", image=PAUSE_IMAGE,
                resources=k8s.V1ResourceRequirements(limits=limits, requests=dict(limits)))],
            # Nothing to save: the GPUs go to a training pod at once.
            termination_grace_period_seconds=0,
            node_selector=dict(pool.node_selector) or None,
            tolerations=_tolerations(pool),
            affinity=k8s.V1Affinity(
                node_affinity=node_affinity,
                pod_anti_affinity=k8s.V1PodAntiAffinity(
                    required_during_scheduling_ignored_during_execution=[apart])),
            priority_class_name=settings.priority_class or None,
            image_pull_secrets=[k8s.V1LocalObjectReference(name=n)
                                for n in settings.image_pull_secrets] or None,
        ),
    )
