"""Copying a state dict to host memory for an async save (staging).

A run saves the same state over and over: the same tensors, the same shapes.
So the host buffers are allocated (and on CUDA pinned) once, at the first
save, and every later save only copies into them: on an H100 that is a copy
at PCIe speed (~1.5 GB of `small` state in well under 0.1 s) instead of
faulting in and pinning gigabytes of fresh host memory per save, which took
0.86 s on the first save of issue 11's run, and 0.3 s per save on this CPU
for 307 MB (docs/performance.md).

This is our own code on purpose. torch's `DefaultStager` reused across
saves is what crashed issue 11: torch 2.11's `DefaultStager._stage` closes
its `StateDictStager` at the end of every stage, which empties its deepcopy
table, so the second `async_save` through a reused stager fails with
`KeyError: <class 'type'>` (pytorch/pytorch#183413); a fresh `DefaultStager`
per save avoids that but pays the allocation every time. `HostBuffers` has
no such state to lose: a dict of buffers keyed by the tensor's path in the
state dict, reallocated only when a shape or dtype changes. Non-tensor
leaves (an optimizer's lr, a step count) are taken fresh at every save.
Anything that goes wrong in here is an ordinary exception, which
`Checkpointer` turns into a `checkpoint_failed` event and a synchronous save.

The copies are issued on the current CUDA stream, after the step's kernels
and before the next step's, so training cannot overwrite a tensor before it
is copied; the host then waits for that stream once (the step is blocked
for the copy, nothing else) before the writer thread reads the buffers.
The next save reuses the buffers only after the previous one committed
(`Checkpointer.save` commits a pending save first).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class HostBuffers:
    """Host copies of one state dict's tensors, kept for the whole run."""

    def __init__(self, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self._tensors: dict[tuple, torch.Tensor] = {}
        self._dtensors: dict[tuple, DTensor] = {}

    @torch.no_grad()
    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        staged = self._copy(state_dict, ())
        if self.pin_memory:
            torch.cuda.current_stream().synchronize()
        return staged

    def _copy(self, obj: Any, path: tuple) -> Any:
        if isinstance(obj, DTensor):
            return self._dtensor(obj, path)
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, dict):
            return {k: self._copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, (*path, i)) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, t: torch.Tensor, path: tuple) -> torch.Tensor:
        buf = self._tensors.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu",
                              pin_memory=self.pin_memory and t.is_cuda)
            self._tensors[path] = buf
        buf.copy_(t.detach(), non_blocking=self.pin_memory and t.is_cuda)
        return buf

    def _dtensor(self, t: DTensor, path: tuple) -> DTensor:
        """A DTensor with the same mesh and placements whose local shard is
        a host buffer, as DCP's own stagers make them."""
        local = self._tensor(t.to_local(), (*path, "_local"))
        held = self._dtensors.get(path)
        if held is None or held.shape != t.shape or held.placements != t.placements:
            # Built once: a detached CPU copy carries the spec; its local
            # tensor is then swapped for the reused buffer.
            held = t.detach().to("cpu")
            self._dtensors[path] = held
        held._local_tensor = local
        return held


class BufferedStager:
    """DCP's AsyncStager protocol over a run's `HostBuffers`: made per save
    (so a test can hand `Checkpointer` any stager it likes), closing it
    keeps the buffers."""

    should_synchronize_after_execute = False

    def __init__(self, buffers: HostBuffers) -> None:
        self.buffers = buffers

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return self.buffers.stage(state_dict)

    def synchronize_staging(self) -> None: ...

    def close(self) -> None: ...


def reused_buffers_factory(device: torch.device) -> Callable[[], BufferedStager]:
    """The production stager: pinned host buffers on CUDA, plain ones on
    CPU, allocated at the first save and reused by every later one."""
    buffers = HostBuffers(pin_memory=device.type == "cuda")
    return lambda: BufferedStager(buffers)
