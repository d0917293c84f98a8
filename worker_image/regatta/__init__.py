"""Regatta's SDK: make a torchrun training program fault-tolerant under the
Regatta control plane (or checkpoint and resume on its own, without one).

    import regatta.preemption; regatta.preemption.install()   # before torch
    import regatta
    run = regatta.init()
    state = regatta.ModelState(model, optimizer)
    start = (r.step if (r := run.resume(state)) else 0)
    for step in range(start + 1, max_steps + 1):
        loss = train_step()
        run.log({"loss": loss}, step=step)
        if run.should_checkpoint(step):
            run.checkpoint(step, state)
        if run.should_stop():
            run.checkpoint(step, state)
            run.exit_preempted(step)
    run.checkpoint(max_steps, state, export=regatta.Export(model))
    run.finish(max_steps)

This module imports no torch: `regatta.storage`, `regatta.manifest`,
`regatta.launch`, `regatta.reporting` and `regatta.preemption` are standard
library only (the control plane imports the first two to verify
checkpoints); `init`, `Run`, `ModelState` and `Export` load torch when first
used. docs/sdk.md is the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"
__all__ = ["Export", "ModelState", "Resumed", "Run", "init"]

if TYPE_CHECKING:
    from regatta.loading import Resumed
    from regatta.run import Run, init
    from regatta.state import Export, ModelState

_LAZY = {"init": "regatta.run", "Run": "regatta.run", "ModelState": "regatta.state",
         "Export": "regatta.state", "Resumed": "regatta.loading"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'regatta' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
