"""Which of this machine's GPUs a logical node's ranks see.

Logical nodes share one machine, and a rank takes the GPU of its local rank
(`regatta.dist`), so without a say here every node's rank 0 would take GPU 0:
a two-node gang on one GPU fails at its first NCCL call ("Duplicate GPU
detected"), and two jobs would crowd onto one device. So each launch sets
`CUDA_VISIBLE_DEVICES` per node:

- a `cpu` pool (the default): empty, so the ranks see no GPU and train on
  gloo, whatever the machine holds (the demo runs the same everywhere);
- a `cuda` pool: the node's own `gpus_per_node` GPUs. A node takes them at
  its first launch and keeps them until it is retired, which frees them for
  its replacement. Free GPUs go first; when there are none left, the node
  shares the ones fewest others hold, but two nodes of one gang never share
  one, which NCCL refuses: that launch fails saying so.

The machine's GPUs are the worker's `CUDA_VISIBLE_DEVICES` when it is set,
else what `nvidia-smi` lists, by index in PCI bus order (the ranks get
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA counts them the same way).
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter

from controlplane.lib.errors import PermanentError

CPU, CUDA = "cpu", "cuda"
DEVICES = (CPU, CUDA)


def machine_gpus() -> tuple[list[str], dict[str, str]]:
    """This machine's GPU ids as CUDA_VISIBLE_DEVICES names them, and the
    variables that make a rank read those ids the same way."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        ids = [g.strip() for g in given.split(",") if g.strip()]
        # CUDA stops at the first invalid id; "-1" is the common "none".
        return (ids if "-1" not in ids else ids[:ids.index("-1")]), {}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return [], {}
    if out.returncode != 0:
        return [], {}
    return [line.strip() for line in out.stdout.splitlines() if line.strip()], {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def gang_devices(nodes: dict[str, dict], gang: list[str], devices: str, per_node: int,
                 where: str, machine: tuple[list[str], dict[str, str]] | None = None
                 ) -> dict[str, dict[str, str]]:
    """The variables each node of `gang` launches with. `nodes` is the node
    book's records of every live node of the fleet; the GPUs a node takes
    are written into its record (the caller holds the book's lock, and may
    pass `machine_gpus()` read before taking it)."""
    if devices != CUDA:
        return {name: {"CUDA_VISIBLE_DEVICES": ""} for name in gang}
    physical, order = machine if machine is not None else machine_gpus()
    if len(physical) < per_node:
        raise PermanentError(
            f"{where}: its nodes each need {per_node} GPU(s) (devices: cuda) and this "
            f"machine shows {len(physical)}; set the pool's devices to cpu, or its "
            f"gpus_per_node to at most {len(physical)}")
    held = Counter(g for name, node in nodes.items() if name not in gang
                   for g in node.get("gpus") or ())
    gang_held: dict[str, str] = {}  # GPU -> the node of this gang that holds it
    for name in gang:
        own = nodes[name].get("gpus") or []
        if len(own) != per_node or not set(own) <= set(physical) or set(own) & set(gang_held):
            # Free GPUs first, then the least shared, never one of this
            # gang's if it can be helped; among equals, the machine's order.
            own = sorted(physical, key=lambda g: (g in gang_held, held[g],
                                                  physical.index(g)))[:per_node]
            nodes[name]["gpus"] = own
        for gpu in own:
            if gpu in gang_held:
                raise PermanentError(
                    f"{where}: nodes {gang_held[gpu]} and {name} of this gang would share GPU "
                    f"{gpu}, and NCCL cannot put two ranks on one GPU: this machine has "
                    f"{len(physical)} GPU(s) for {len(gang)} node(s) x {per_node}")
            gang_held[gpu] = name
        held.update(own)
    return {name: {"CUDA_VISIBLE_DEVICES": ",".join(nodes[name]["gpus"]), **order}
            for name in gang}
