"""What a checkpoint holds: DCP state from models and optimizers, and the
consolidated model a successful run exports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

EXPORT_DIR = "export"


class ModelState(Stateful):
    """A model and its optimizer as one DCP `Stateful`, for DDP, FSDP or a
    plain module alike: sharded tensors stay sharded (each rank writes its
    own shards) and load back at any world size.

        run.checkpoint(step, regatta.ModelState(model, optimizer))
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer or [], model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict.get("optim", {}))


def to_state_dict(state: Any) -> dict[str, Any]:
    """The plain state dict DCP writes: a `Stateful` gives its own; in a
    dict, each `Stateful` value is replaced by its state dict."""
    if isinstance(state, Stateful) and not isinstance(state, dict):
        return state.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict or a Stateful, not "
                        f"{type(state).__name__}")
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items()}


def load_into(state: Any, loaded: dict[str, Any]) -> None:
    """Hand what DCP loaded back to the Stateful objects it came from."""
    if isinstance(state, Stateful) and not isinstance(state, dict):
        state.load_state_dict(loaded)
        return
    for key, value in state.items():
        if isinstance(value, Stateful):
            value.load_state_dict(loaded[key])
        else:
            state[key] = loaded[key]


@dataclass
class Export:
    """The consolidated model of a finished run: `step-N/export/model.pt` (a
    plain `torch.save` of the whole model's state dict, gathered to rank 0
    from FSDP shards) and `export/config.json`, both in the manifest. The
    control plane copies `export/` into its model registry without torch.

        run.checkpoint(final_step, state, export=regatta.Export(model, config))
    """

    model: torch.nn.Module
    config: dict[str, Any] = field(default_factory=dict)

    def write(self, target: Path, d) -> list[str]:
        """Collective (every rank gathers); rank 0 writes. Returns rank 0's
        relative paths for the manifest."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.model, options=options)
        if d.rank != 0:
            return []
        folder = target / EXPORT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(full, folder / "model.pt")
        (folder / "config.json").write_text(json.dumps(self.config, indent=1, sort_keys=True))
        return [f"{EXPORT_DIR}/model.pt", f"{EXPORT_DIR}/config.json"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
