"""Per-rank exit records: REGATTA_STATUS_DIR/rank-<RANK>.json, written just
before a rank exits, which the control plane reads instead of torchrun's
single exit code (regatta/contract.py). Standard library only."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from regatta.contract import FAILURE_CLASS, status_file
from regatta.launch import Launch

log = logging.getLogger("regatta")


def write_status(launch: Launch, code: int, error: str | None, step: int) -> None:
    if not launch.status_dir:
        return
    try:
        folder = Path(launch.status_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / status_file(launch.rank)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({
            "rank": launch.rank, "exit_code": code, "failure_class": FAILURE_CLASS.get(code),
            "error": error, "step": step, "time": time.time(),
            "job_id": launch.job_id, "attempt_id": str(launch.attempt_id),
        }))
        os.replace(tmp, path)
    except OSError:
        log.exception("could not write the status file in %s", launch.status_dir)
