"""Which provider serves a cluster, and the row-to-provider mapping.

Providers are named by kind ("local", "kubernetes"); `register` adds another
(tests register an in-memory one: tests/support/memory_provider.py).
"""

from importlib import import_module

from controlplane.lib.errors import PermanentError

from .base import PoolInfo

_IMPLEMENTATIONS: dict[str, object] = {
    "local": "clusters.providers.local:LocalProvider",
    "kubernetes": "clusters.providers.kubernetes:KubernetesProvider",
    "slurm": "clusters.providers.slurm:SlurmProvider",
}


def register(kind: str, cls) -> None:
    _IMPLEMENTATIONS[kind] = cls


def provider_class(kind: str):
    target = _IMPLEMENTATIONS.get(kind)
    if target is None:
        raise PermanentError(f"unknown provider {kind!r}; one of {sorted(_IMPLEMENTATIONS)}")
    if isinstance(target, str):
        module_name, class_name = target.split(":")
        target = getattr(import_module(module_name), class_name)
    return target


def get_provider(cluster):
    """The provider object for a Cluster row (built from its typed settings)."""
    return provider_class(cluster.provider).for_cluster(cluster.name, cluster.config.provider)


def pool_info(pool) -> PoolInfo:
    return PoolInfo(
        cluster=pool.cluster.name, name=pool.name, instance_type=pool.instance_type,
        gpus_per_node=pool.gpus_per_node, capacity_type=pool.capacity_type, size=pool.size,
        spare_count=pool.spare_count, efa=pool.efa, node_selector=dict(pool.node_selector),
        tolerations=list(pool.tolerations), settings=pool.config,
    )
