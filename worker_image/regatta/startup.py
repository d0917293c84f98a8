"""Where a rank is in its start-up, for the node's launcher to read:
REGATTA_STATUS_DIR/startup-<RANK>.json, rewritten at each start-up phase
(config, rendezvous, setup, resume, compiling, training) and once more at
the first step. Nothing reaches the control plane this way; a launcher on
the node reads it when a launched attempt has said nothing for a while, so
the job's timeline can say what its ranks are doing (importing, waiting in
rendezvous, compiling, running without reporting) instead of nothing.

Standard library only, and never raises: a marker that cannot be written
costs the rank nothing but this account of it.
"""

from __future__ import annotations

import json
import os
import time

from regatta import contract

# A rank's whole start-up is a handful of phases; more would be a loop
# marking the same phase, which this bounds.
HISTORY = 16


def marker_path(status_dir: str, rank: int | str) -> str:
    return os.path.join(status_dir, contract.startup_file(rank))


def mark(phase: str, **fields) -> None:
    """Record that this rank entered `phase` now (REGATTA_STATUS_DIR unset: nothing)."""
    status_dir = os.environ.get(contract.STATUS_DIR)
    if not status_dir:
        return
    rank = os.environ.get(contract.RANK, "0")
    path = marker_path(status_dir, rank)
    now = time.time()
    try:
        with open(path) as fh:
            history = json.load(fh).get("history") or []
    except (OSError, ValueError, AttributeError):
        history = []
    history = [*history, [phase, round(now, 3)]][-HISTORY:]
    record = {"rank": int(rank) if rank.isdigit() else rank, "pid": os.getpid(),
              "phase": phase, "at": now, "history": history, **fields}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(status_dir, exist_ok=True)
        with open(tmp, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
    except OSError:
        pass
