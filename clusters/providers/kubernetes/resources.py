"""CPU and memory for a training pod, so it runs with Guaranteed QoS.

A pod that requests only GPUs and EFA devices is BestEffort for CPU and
memory: the kubelet evicts it first under node memory pressure, and the
scheduler may pack other pods beside it. Requests equal to limits make it
Guaranteed. The amount, per GPU, comes from the first of:
1. the pool's `cpu_per_gpu` / `memory_per_gpu`;
2. the smallest allocatable of the nodes the attempt was placed on (the
   provider reads them at launch);
3. the pool's instance type (instances.py);
less `daemonset_headroom` in cases 2 and 3, for the node's own DaemonSets
(device plugins, CNI, the node monitoring agent), which would otherwise
leave a full-node pod unschedulable.
"""

from __future__ import annotations

from decimal import ROUND_FLOOR, Decimal

from kubernetes.utils.quantity import parse_quantity

from controlplane.lib.errors import PermanentError

from ..base import PoolInfo
from .instances import INSTANCE_TYPES

_GIB = Decimal(2**30)
_MIB = Decimal(2**20)


def _parse(pool: PoolInfo, key: str, value) -> Decimal:
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise PermanentError(f"pool {pool.name}: {key} {value!r} is not a quantity") from exc


def per_gpu(pool: PoolInfo, allocatable: dict | None) -> tuple[Decimal, Decimal] | None:
    """(CPU cores, memory bytes) per GPU, or None when nothing says."""
    settings = pool.settings
    if settings.cpu_per_gpu and settings.memory_per_gpu:
        return (_parse(pool, "cpu_per_gpu", settings.cpu_per_gpu),
                _parse(pool, "memory_per_gpu", settings.memory_per_gpu))
    keep = Decimal(1) - Decimal(str(settings.daemonset_headroom))
    if keep <= 0:
        raise PermanentError(f"pool {pool.name}: daemonset_headroom must be below 1")
    gpus = Decimal(max(1, pool.gpus_per_node))
    if allocatable and allocatable.get("cpu") and allocatable.get("memory"):
        node_gpus = Decimal(max(1, int(allocatable.get("gpus") or pool.gpus_per_node)))
        cpu = _parse(pool, "allocatable cpu", allocatable["cpu"]) / node_gpus
        memory = _parse(pool, "allocatable memory", allocatable["memory"]) / node_gpus
    elif pool.instance_type in INSTANCE_TYPES:
        known = INSTANCE_TYPES[pool.instance_type]
        gpus = Decimal(max(1, known.gpus))
        cpu, memory = Decimal(known.vcpus) / gpus, Decimal(known.memory_gib) * _GIB / gpus
    else:
        return None
    cpu, memory = cpu * keep, memory * keep
    if settings.cpu_per_gpu:
        cpu = _parse(pool, "cpu_per_gpu", settings.cpu_per_gpu)
    if settings.memory_per_gpu:
        memory = _parse(pool, "memory_per_gpu", settings.memory_per_gpu)
    return cpu, memory


def cpu_memory(pool: PoolInfo, gpus: int, allocatable: dict | None = None) -> dict[str, str]:
    """{"cpu", "memory"} for a pod of `gpus` GPUs: requests and limits alike.
    Empty when the pool turns Guaranteed QoS off or nothing gives an amount."""
    if not pool.settings.guaranteed_qos:
        return {}
    share = per_gpu(pool, allocatable)
    if share is None:
        return {}
    cpu, memory = share
    millis = (cpu * gpus * 1000).to_integral_value(ROUND_FLOOR)
    mib = (memory * gpus / _MIB).to_integral_value(ROUND_FLOOR)
    cores, rest = divmod(int(millis), 1000)
    return {"cpu": str(cores) if rest == 0 else f"{int(millis)}m", "memory": _mebibytes(int(mib))}


def _mebibytes(mib: int) -> str:
    """`mib` MiB in the canonical form Go's resource.Quantity writes (the
    largest binary suffix that keeps it whole: 2048Mi is 2Gi). A controller
    that round-trips a TrainJob through Go's types (Kueue) then sends back
    the same string, and the Trainer's immutable `spec.trainer` is unchanged."""
    for suffix, size in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib and mib % size == 0:
            return f"{mib // size}{suffix}"
    return f"{mib}Mi"


def smallest_allocatable(nodes: list[dict]) -> dict | None:
    """The allocatable CPU and memory of the smallest of `nodes` (Node JSON),
    with its GPU capacity, so a pod sized from it fits on every one."""
    best = None
    for node in nodes:
        status = node.get("status") or {}
        alloc = status.get("allocatable") or {}
        if not alloc.get("cpu") or not alloc.get("memory"):
            continue
        try:
            key = (Decimal(parse_quantity(alloc["memory"])), Decimal(parse_quantity(alloc["cpu"])))
        except (ValueError, TypeError, ArithmeticError):
            continue
        gpus = (status.get("capacity") or {}).get("nvidia.com/gpu") or alloc.get("nvidia.com/gpu")
        if best is None or key < best[0]:
            best = (key, {"cpu": alloc["cpu"], "memory": alloc["memory"], "gpus": gpus})
    return best[1] if best else None
