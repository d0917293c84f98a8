"""The node-source part of the Kubernetes provider: what brings up the
machine behind a pool's nodes, by the pool's settings (docs/kubernetes.md,
"replace"): an EKS managed node group's Auto Scaling group (`asg_name`,
aws_node_groups.py), Karpenter (`node_autoscaler: karpenter`, capacity.py),
or neither (a fixed pool: its nodes come from its node group's own size).

One small class each, with one interface: `coming` (the pool's machines
asked for and not joined yet), `provision`, `replace`, `scaling_status`,
`release`, `free` (what holds the GPUs of nodes an attempt is placed on)
and `keeps_standbys`. They go through the provider's plumbing (`_call`,
`_json`, `reads`, `aws()`), so timeouts and the error classes are the rest
of the provider's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from controlplane.lib.errors import PermanentError, TemporaryError

from ..base import NodeInfo, PoolInfo, ScalingStatus
from . import capacity
from . import manifests as mf
from .config import replace_mode


class NodeSource(ABC):
    """What every node source answers alike unless it says otherwise: no
    machine on its way, capacity there when asked, nothing held after a
    node retired, nothing of its own on a placed node's GPUs. Each source
    says how it provisions and replaces."""

    keeps_standbys = True

    def __init__(self, provider):
        self.p = provider

    def coming(self, pool: PoolInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        return []

    @abstractmethod
    def provision(self, pool: PoolInfo, name: str) -> NodeInfo: ...

    @abstractmethod
    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None: ...

    def scaling_status(self, pool: PoolInfo, since) -> ScalingStatus:
        return ScalingStatus()

    def release(self, pool: PoolInfo, node: str, provider_id: str) -> str | None:
        return ""

    def free(self, pool: PoolInfo, placed: set[str]) -> None:
        """Let go of what holds the GPUs of the nodes an attempt is placed on."""
        return None  # only a source that holds GPUs ahead of a launch (Karpenter) has any


class FixedPool(NodeSource):
    """Neither: nothing can be asked for, and a node cannot be replaced
    (deleting a managed node group's Node only makes its kubelet register the
    same instance again: config.replace_mode says so)."""

    def provision(self, pool: PoolInfo, name: str) -> NodeInfo:
        raise PermanentError(
            f"pool {pool.name}: spares come from its node group; set 'asg_name' to let "
            "Regatta add one")

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        replace_mode(pool.name, pool.settings)  # raises: it says what is missing
        return None


class AutoScalingGroup(NodeSource):
    """An EKS managed node group's Auto Scaling group (aws_node_groups.py)."""

    def coming(self, pool: PoolInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        """An instance of the group that has not registered yet (a spare or a
        replacement still booting) is the pool's all the same: listed not
        ready, so the reconciler keeps its row instead of calling it gone."""
        joined = {_instance(n.provider_id) for n in nodes} | {n.name for n in nodes}
        return [n for n in self.p.aws().list_nodes(pool)
                if _instance(n.provider_id) not in joined and n.name not in joined]

    def provision(self, pool: PoolInfo, name: str) -> NodeInfo:
        node = self.p.aws().provision(pool)
        if node is None:
            # The group is launching (this ask or an earlier one): its instance
            # is listed, and joins as a spare, in a later pass. A row under a
            # name of ours would only be found gone then.
            raise TemporaryError(f"pool {pool.name}: Auto Scaling group "
                                 f"{pool.settings.asg_name} is launching an instance")
        return node

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        """Terminate the instance through the group without lowering its
        desired capacity, so the group launches a new one (listed by a later
        pass; nothing waits for it here), then delete the Node so its pods go
        at once. The instance is found by the Node's providerID, or by the
        node's name among the group's instances when the Node object is gone
        already."""
        replace_mode(pool.name, pool.settings)  # raises on a contradiction
        p = self.p
        found = p._json(f"read node {node}", p.core.read_node, node, ok=(404,))
        provider_id = ((found or {}).get("spec") or {}).get("providerID", "")
        aws = p.aws()
        provider_id = provider_id or aws.provider_id_for(pool, node)
        new = None
        # No live instance behind it: it left the group already (a repeat call).
        if provider_id:
            new = aws.replace(pool, provider_id)
        p._call(f"delete node {node}", p.core.delete_node, node, ok=(404,))
        return new

    def scaling_status(self, pool: PoolInfo, since) -> ScalingStatus:
        """The group's account of the asks (its scaling activities)."""
        return self.p.aws().scaling_status(pool, since)

    def release(self, pool: PoolInfo, node: str, provider_id: str) -> str | None:
        if not provider_id.startswith("aws://"):
            return ""
        return self.p.aws().release(pool, provider_id)


class Karpenter(NodeSource):
    """Karpenter launches a machine for a pod that no node can take: a spare
    or a successor is asked for with a capacity pod (capacity.py), whose
    pending state stands for the ask. Its pools keep no standby pods: an idle
    node with one would never look empty to Karpenter's consolidation, and
    the capacity pod already holds a spare's GPUs."""

    keeps_standbys = False

    def coming(self, pool: PoolInfo, nodes: list[NodeInfo]) -> list[NodeInfo]:
        """Spares asked of Karpenter whose node has not joined yet: listed not
        ready under the name Regatta gave them, so their rows wait."""
        joined = {n.name for n in nodes}
        coming = []
        for pod in self._capacity_pods(pool):
            name = (pod["metadata"].get("labels") or {}).get(capacity.LABEL_FOR)
            if name and (pod.get("spec") or {}).get("nodeName") not in joined:
                coming.append(NodeInfo(name=name, ready=False, gpus=pool.gpus_per_node))
        return coming

    def provision(self, pool: PoolInfo, name: str) -> NodeInfo:
        self._ask(pool, f"spare/{name}", spare_name=name)
        return NodeInfo(name=name, ready=False, gpus=pool.gpus_per_node)

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        """Delete the Node: Karpenter's finalizer terminates the instance, and
        it launches capacity anew for the pending pod asked here, which joins
        the pool by its labels (list_nodes) in a later pass."""
        replace_mode(pool.name, pool.settings)  # raises on a contradiction
        p = self.p
        p._call(f"delete node {node}", p.core.delete_node, node, ok=(404,))
        self._ask(pool, f"replaces/{node}", avoid=(node,))
        return None

    def free(self, pool: PoolInfo, placed: set[str]) -> None:
        """Delete the capacity pods bound to the placed nodes: the training
        (or preflight) pods need the GPUs they hold."""
        for pod in self._capacity_pods(pool):
            if (pod.get("spec") or {}).get("nodeName") in placed:
                self.p._delete_pod(pod["metadata"]["name"], "capacity pod")

    def _capacity_pods(self, pool: PoolInfo, **query) -> list[dict]:
        return self.p.reads.pods(capacity.selector(pool),
                                 f"list capacity pods of {pool.name}", **query)

    def _ask(self, pool: PoolInfo, key: str, spare_name: str = "",
             avoid: tuple[str, ...] = ()) -> None:
        # Karpenter launches only for a pod that no node can take. Kept off
        # every node the pool has now: the scheduler would bind it to an idle
        # one, Karpenter would see nothing pending, and the pool would be a
        # node short after each replacement (or never get its spare).
        p = self.p
        present = tuple(n["metadata"]["name"] for n in p._pool_nodes(pool))
        body = mf.to_dict(capacity.capacity_pod(pool, p.settings, key, spare_name=spare_name,
                                                avoid=tuple(set(avoid) | set(present))))
        # 409: asked before (a repeated call), one pod all the same.
        p._call(f"create capacity pod for {key}", p.core.create_namespaced_pod, p.ns, body,
                ok=(409,))


def node_source_for(provider, pool: PoolInfo) -> NodeSource:
    """The pool's node source. A pool that names both is Karpenter's, as it
    was before the parts: its replacement is refused (config.replace_mode)."""
    if pool.settings.node_autoscaler == "karpenter":
        return Karpenter(provider)
    if pool.settings.asg_name:
        return AutoScalingGroup(provider)
    return FixedPool(provider)


def _instance(provider_id: str) -> str:
    return provider_id.rstrip("/").rsplit("/", 1)[-1] if provider_id else ""
