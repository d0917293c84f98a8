"""Choosing and loading the checkpoint to resume from; only a committed,
verified checkpoint is ever loaded."""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from regatta.checkpoint import STATE_DIR, Checkpointer
from regatta.state import load_into, to_state_dict
from regatta.storage import step_name

log = logging.getLogger("regatta.checkpoint")
_STEP_IN_URI = re.compile(r"step-(\d+)/?$")


@dataclass
class Resumed:
    """What `Run.resume` found: the step, its URI, this rank's rank state
    (None if none was saved), and for a files checkpoint the local folder."""

    step: int
    uri: str
    rank_state: Any = None
    path: Path | None = None


def choose(ckpt: Checkpointer, resume_step: str, resume_uri: str, on_skip) -> int | None:
    """Rank 0 picks the step (see docs/trainer-protocol.md); every rank learns it."""
    choice: list[Any] = [None]
    if ckpt.d.rank == 0:
        choice[0] = _pick(ckpt, resume_step, resume_uri, on_skip)
    dist.broadcast_object_list(choice, src=0, group=ckpt.d.ckpt_group)
    return choice[0]


def _pick(ckpt: Checkpointer, spec: str, uri: str, on_skip) -> int | None:
    match = _STEP_IN_URI.search(uri.rstrip("/") + "/") if uri else None
    if match:
        # The control plane named the folder; its step bounds the search, so
        # a folder that fails verification falls back to an older good one.
        return ckpt.storage.newest_verified(at_most=int(match.group(1)), on_skip=on_skip)
    spec = (spec or "latest").strip().lower()
    if spec == "none":
        return None
    at_most = None if spec == "latest" else int(spec)
    return ckpt.storage.newest_verified(at_most=at_most, on_skip=on_skip)


def local_folder(ckpt: Checkpointer, step: int) -> tuple[Path, bool]:
    """step-N as a local folder (downloaded from S3); True if it is a copy."""
    direct = ckpt.storage.local_dir(step)
    if direct is not None:
        return direct, False
    source = ckpt.staging_root / f"load-{step_name(step)}"
    shutil.rmtree(source, ignore_errors=True)
    ckpt.storage.download_step(step, source)
    return source, True


def load_state(ckpt: Checkpointer, step: int, state: Any) -> Resumed:
    """Load DCP state in place (collective) and this rank's rank state."""
    source, copied = local_folder(ckpt, step)
    state_dict = to_state_dict(state)
    dcp.load(state_dict, storage_reader=dcp.FileSystemReader(str(source)),
             process_group=ckpt.d.ckpt_group)
    load_into(state, state_dict)
    rank_file = source / STATE_DIR / f"rank-{ckpt.d.rank}.pt"
    fallback = source / STATE_DIR / "rank-0.pt"
    path = rank_file if rank_file.exists() else fallback
    rank_state = torch.load(path, weights_only=False) if path.exists() else None
    if copied:
        shutil.rmtree(source, ignore_errors=True)
    ckpt.last_committed = step
    return Resumed(step, ckpt.storage.step_uri(step), rank_state)
