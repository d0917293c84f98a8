"""Process-group set-up from torchrun's environment, and which exit code a failure gets."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from regatta import contract as c
from regatta.contract import EXIT_CODE_ERROR, EXIT_COLLECTIVE


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    ckpt_group: object  # a gloo group of its own, so async saves never share a queue with training
    # Another gloo group for the per-step agreement (trainer/agreement.py):
    # CPU tensors, so reading its result never waits for the GPU, and apart
    # from ckpt_group, whose collectives DCP runs from its own thread.
    control_group: object

    def leave(self) -> None:
        """Free the SDK's two groups once the run is over (every rank, past
        its last collective on them): their gloo threads are joined here,
        while the interpreter is whole.

        A gloo group still alive at interpreter teardown aborts a run that
        succeeded, now and then ("terminate called without an active
        exception", SIGABRT): its worker thread drops the tensors of the
        collective that just completed, their Python objects need the GIL,
        and a finalizing interpreter ends any thread that asks for it. The
        threads stop only when the C++ group is freed, so the references
        go too; the program's own default group stays its to destroy.
        """
        for name in ("ckpt_group", "control_group"):
            group = getattr(self, name)
            # Unregistered already if the program destroyed the default group
            # first; dropping the reference is enough then.
            if group is not None and dist.is_initialized():
                dist.destroy_process_group(group)
            setattr(self, name, None)


def init(startup_timeout_s: float) -> Dist:
    """env:// initialisation: NCCL with CUDA, gloo without; or, when the
    program already initialised torch.distributed, that group.

    NCCL_* variables are left exactly as the launcher set them; the generous
    start-up timeout covers slow rendezvous and first-step compilation and is
    tightened by `tighten_timeout` once a step has gone through.
    """
    for name in (c.RANK, c.WORLD_SIZE, c.LOCAL_RANK, c.MASTER_ADDR):
        os.environ.setdefault(name, c.LAUNCH_ENV[name].default)
    if c.MASTER_PORT not in os.environ:
        os.environ[c.MASTER_PORT] = str(_free_port())
    local_rank = int(os.environ[c.LOCAL_RANK])
    if torch.cuda.is_available():
        device, backend = cuda_device(local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=startup_timeout_s)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout,
                                **kwargs)
    else:
        # The program made its own group (a user's script); the SDK adds its
        # two gloo groups beside it and leaves the default group alone.
        backend = dist.get_backend()
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
    control_group = dist.new_group(backend="gloo", timeout=timeout)
    return Dist(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=device,
        backend=backend,
        ckpt_group=ckpt_group,
        control_group=control_group,
    )


def cuda_device(local_rank: int) -> torch.device:
    """This rank's GPU: the one at its local rank. More ranks on a node than
    it has GPUs is a launch mistake (`--nproc-per-node`, or a job's
    `gpus_per_node` above the node's), and CUDA would say only "invalid
    device ordinal"; NCCL cannot put two ranks on one GPU either."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RuntimeError(
            f"LOCAL_RANK {local_rank} has no GPU of its own: this node shows {count} CUDA "
            f"device(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            f"; start at most {count} rank(s) per node (torchrun --nproc-per-node)")
    return torch.device("cuda", local_rank)


def tighten_timeout(seconds: float, d: Dist) -> None:
    """The collective timeout after the first step, on the default group and
    on `d`'s two: a checkpoint or agreement collective that a stuck peer
    never joins then fails in `seconds` too, rather than after the start-up
    timeout (30 min by default). Call it with no collective in flight."""
    # A private helper (torch >= 2.3); without it the start-up timeout stays.
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return
    timeout = timedelta(seconds=seconds)
    for group in (None, d.ckpt_group, d.control_group):  # None: the default group
        setter(timeout, group)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_COLLECTIVE_TYPES = tuple(
    t for t in (
        getattr(dist, "DistBackendError", None),
        getattr(dist, "DistNetworkError", None),
        getattr(dist, "DistStoreError", None),
    ) if t is not None
)
_COLLECTIVE_MESSAGES = (
    "connection reset", "connection closed", "connection refused", "broken pipe",
    "timed out", "timeout", "gloo", "nccl", "socket", "rendezvous", "peer",
)


def classify(exc: BaseException) -> int:
    """Exit code for an exception raised while training (84 or 1)."""
    chain = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for e in chain:
        if isinstance(e, _COLLECTIVE_TYPES) or isinstance(e, TimeoutError):
            return EXIT_COLLECTIVE
        # Gloo reports a lost peer as a plain RuntimeError from a collective.
        if type(e) is RuntimeError and any(m in str(e).lower() for m in _COLLECTIVE_MESSAGES):
            return EXIT_COLLECTIVE
        if isinstance(e, ConnectionError):
            return EXIT_COLLECTIVE
    return EXIT_CODE_ERROR
