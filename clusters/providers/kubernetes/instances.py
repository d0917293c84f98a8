"""What a GPU instance type offers, for the pod requests Regatta derives
when a pool does not set them (docs/kubernetes.md, "Resources").

Figures from the EC2 instance type pages: vCPUs, memory in GiB, GPUs and
the most EFA interfaces the type takes. A type not listed here gets no
derived CPU/memory (set `cpu_per_gpu`/`memory_per_gpu` on the pool, or let
Regatta read a node's allocatable) and one EFA device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    vcpus: int
    memory_gib: int
    gpus: int
    efa: int


INSTANCE_TYPES = {
    "p6-b200.48xlarge": InstanceType(192, 2048, 8, 8),
    "p5en.48xlarge": InstanceType(192, 2048, 8, 16),
    "p5e.48xlarge": InstanceType(192, 2048, 8, 32),
    "p5.48xlarge": InstanceType(192, 2048, 8, 32),
    "p4de.24xlarge": InstanceType(96, 1152, 8, 4),
    "p4d.24xlarge": InstanceType(96, 1152, 8, 4),
    "p3dn.24xlarge": InstanceType(96, 768, 8, 1),
    "g6e.48xlarge": InstanceType(192, 1536, 8, 4),
    "g6.48xlarge": InstanceType(192, 768, 8, 1),
    "g5.48xlarge": InstanceType(192, 768, 8, 1),
}


def efa_devices(instance_type: str) -> int:
    """EFA devices one pod using the whole node requests: every interface
    the type has, since NCCL over EFA scales with them (a p5 has 32)."""
    known = INSTANCE_TYPES.get(instance_type)
    return known.efa if known else 1
