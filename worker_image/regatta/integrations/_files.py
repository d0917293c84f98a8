"""Which of a framework's checkpoint files each rank contributes (standard
library only)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

# Per-rank files a framework writes into a shared checkpoint folder:
# transformers' rng_state_<r>.pth, and any name ending _<r>.<ext> in the same way.
_PER_RANK = re.compile(r"^(?P<stem>rng_state)_(?P<rank>\d+)\.pth$")


def rank_share(folder: Path, rank: int) -> Path:
    """A temporary folder of links to the files of `folder` this rank commits:
    rank 0 everything except other ranks' per-rank files; rank r > 0 only its
    own per-rank files (so that no two ranks write the same file, and a file
    rank r wrote on another node still reaches the checkpoint)."""
    share = Path(tempfile.mkdtemp(prefix=f"regatta-share-r{rank}-"))
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(folder)
        match = _PER_RANK.match(rel.name) if len(rel.parts) == 1 else None
        owner = int(match["rank"]) if match else 0
        if owner != rank:
            continue
        dest = share / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)
    return share


def drop(share: Path) -> None:
    shutil.rmtree(share, ignore_errors=True)
