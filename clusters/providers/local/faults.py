"""Operators' fault injection on the local fleet: kill, hang, XID, spot notice,
preflight failure, one rank killed (the OOM killer's way); and killing a rank
of an attempt by its number, for the end-to-end tests."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

from regatta.node import procs

from controlplane.lib.errors import PermanentError

from ..base import FaultKind

XID_EVIDENCE = {"xid": 79, "message": "GPU has fallen off the bus"}
SPOT_NOTICE_LEAD_S = 120


def kill_node(fleet: Path, node: str) -> dict:
    """Everything of the node dies at once, launcher included, as if it lost power."""
    found = procs.scan(fleet=str(fleet), node=node)
    killed = procs.kill_hard(found)
    procs.wait_gone(found, 5.0, interval=0.02)
    return {"fault": FaultKind.KILL, "node": node, "signal": signal.SIGKILL.value,
            "pids": sorted(killed)}


def kill_one_rank(fleet: Path, node: str) -> dict:
    """SIGKILL the node's lowest rank and nothing else, as the OOM killer
    does: the node stays up, its torchrun reports the rank's signal."""
    ranks = sorted(procs.top_ranks(procs.scan(fleet=str(fleet), node=node)),
                   key=lambda p: p.rank)
    if not ranks:
        raise PermanentError(f"no rank runs on {node}")
    procs.send(ranks[:1], signal.SIGKILL)
    return {"fault": FaultKind.KILL_RANK, "node": node, "signal": signal.SIGKILL.value,
            "rank": ranks[0].rank, "pids": [ranks[0].pid]}


def hang_node(fleet: Path, node: str) -> dict:
    """The node's ranks freeze (SIGSTOP) but stay alive: only missed heartbeats tell."""
    ranks = [p for p in procs.scan(fleet=str(fleet), node=node) if p.rank is not None]
    stopped = procs.send(ranks, signal.SIGSTOP)
    deadline = time.monotonic() + 5.0
    # Delivery is asynchronous; the fault is in place once every rank shows "T".
    while time.monotonic() < deadline and any(
            (procs.stat(pid) or (0, "T", 0))[1] not in ("T", "t", "Z") for pid in stopped):
        time.sleep(0.02)
    return {"fault": FaultKind.HANG, "node": node, "signal": signal.SIGSTOP.value,
            "pids": sorted(stopped)}


def health_signal(pool: str, node: str, kind: str, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    key = f"{kind}-{node}-{uuid.uuid4().hex[:12]}"
    if kind == FaultKind.XID:
        return {"pool": pool, "node": node, "kind": "xid", "severity": "critical",
                "message": f"XID {XID_EVIDENCE['xid']}: {XID_EVIDENCE['message']}",
                "evidence": {**XID_EVIDENCE, "injected": True}, "key": key, "time": now}
    if kind == FaultKind.SPOT_NOTICE:
        return {"pool": pool, "node": node, "kind": "spot_notice", "severity": "warning",
                "message": "spot instance interruption notice: terminate in 120 s",
                "evidence": {"action": "terminate", "time": now + SPOT_NOTICE_LEAD_S,
                             "injected": True},
                "key": key, "time": now}
    raise PermanentError(f"not a health signal fault: {kind!r}")


def kill_rank(attempt_dir: str, rank: int, sig: int = signal.SIGKILL) -> int:
    """Signal the process of one global rank of a running attempt; return its pid."""
    ranks = procs.top_ranks(procs.scan(attempt_dir=str(Path(attempt_dir))))
    match = [p for p in ranks if p.rank == rank]
    if not match:
        raise PermanentError(f"no running rank {rank} in {attempt_dir}")
    procs.send(match, sig)
    return match[0].pid


def lost_signal(pool: str, node: str, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    return {"pool": pool, "node": node, "kind": "lost", "severity": "critical",
            "message": "node lost: every process on it was killed",
            "evidence": {"fault": FaultKind.KILL, "injected": True},
            "key": f"lost-{node}-{uuid.uuid4().hex[:12]}", "time": now}
