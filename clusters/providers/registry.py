"""Which provider serves a cluster."""

from importlib import import_module

from controlplane.lib.errors import PermanentError

from .base import PoolInfo

_IMPLEMENTATIONS = {
    "local": "clusters.providers.local:LocalProvider",
    "kubernetes": "clusters.providers.kubernetes:KubernetesProvider",
    "memory": "clusters.providers.memory:MemoryProvider",
}


def get_provider(cluster):
    """The provider object for a Cluster row (built from its settings)."""
    target = _IMPLEMENTATIONS.get(cluster.provider)
    if target is None:
        raise PermanentError(f"cluster {cluster.name}: unknown provider {cluster.provider!r}")
    module_name, class_name = target.split(":")
    cls = getattr(import_module(module_name), class_name)
    return cls.for_cluster(cluster)


def pool_info(pool) -> PoolInfo:
    return PoolInfo(
        cluster=pool.cluster.name, name=pool.name, instance_type=pool.instance_type,
        gpus_per_node=pool.gpus_per_node, capacity_type=pool.capacity_type, size=pool.size,
        spare_count=pool.spare_count, efa=pool.efa, node_selector=dict(pool.node_selector),
        tolerations=list(pool.tolerations), settings=dict(pool.settings),
    )
