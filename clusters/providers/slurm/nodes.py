"""Slurm's nodes as the provider protocol sees them.

A node's `State` is a base state and flags: `IDLE`, `ALLOCATED+DRAIN`,
`DOWN+NOT_RESPONDING`, `IDLE*` (`*`: slurmd is not answering). Regatta's
cordon is Slurm's DRAIN; a node Slurm calls DOWN or FAIL is not ready, and is
failed once that lasts the cluster's grace (clusters/reconcile/follow.py),
with Slurm's own state and reason as the evidence. A drain or down that
is neither Regatta's (its reasons start with REASON_PREFIX) nor Slurm's own
"Not responding" is a hold that Regatta follows (`admin_hold`).
"""

from __future__ import annotations

import re

from ..base import NodeInfo

# A node whose slurmd does not answer (`IDLE*`) is not ready: the cluster's
# grace (node_failure_grace_s), not Slurm's longer SlurmdTimeout, decides
# when that is a failure, and a node coming back to service must answer.
NOT_READY = frozenset({"DOWN", "FAIL", "FAILING", "FUTURE", "INVAL", "UNKNOWN",
                       "POWERED_DOWN", "POWERING_DOWN", "REBOOT_ISSUED", "NOT_RESPONDING"})
UNSCHEDULABLE = frozenset({"DRAIN", "DRAINED", "DRAINING", "MAINTENANCE", "RESERVED"})
LOST = frozenset({"DOWN", "FAIL"})
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
# What Regatta writes as the reason of its own drains: a drain with another
# reason is an operator's or Slurm's health check's.
REASON_PREFIX = "regatta: "


def state_words(state: str) -> set[str]:
    words = set()
    for part in state.split("+"):
        if part.endswith("*"):
            words.add("NOT_RESPONDING")
        words.add(part.rstrip("*~#!%$@^-"))
    return words


def gpus_of(gres: str) -> int:
    return sum(int(n) for n in _GPUS.findall(gres or ""))


def in_pool(rec: dict, partition: str, feature: str) -> bool:
    partitions = (rec.get("Partitions") or "").split(",")
    features = (rec.get("AvailableFeatures") or "").split(",")
    return partition in partitions and (not feature or feature in features)


# What slurmctld says of a node that stopped answering, or came back from
# that by itself: a fault that Regatta's grace judges (the node is not
# ready), not a hold that anyone put on it.
SLURM_OWN_REASONS = ("Not responding", "Node unexpectedly rebooted",
                     "Node silently failed and came back", "Kill task failed")
HOLDS = frozenset({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})


def admin_hold(rec: dict) -> str:
    """The hold someone other than Regatta put on the node in Slurm (an
    admin's drain or down, Slurm's own health check draining it), in their
    words; "" for none, for Regatta's own (REASON_PREFIX), and for a node
    Slurm calls down because it stopped answering."""
    if not state_words(rec.get("State", "")) & HOLDS:
        return ""
    reason = _reason(rec)
    said = reason.split(" [", 1)[0].strip()
    if said.startswith(REASON_PREFIX) or said.startswith(SLURM_OWN_REASONS):
        return ""
    return reason or rec.get("State", "")


def node_info(rec: dict, pool_name: str) -> NodeInfo:
    words = state_words(rec.get("State", ""))
    ready = not words & NOT_READY
    features = [f for f in (rec.get("AvailableFeatures") or "").split(",")
                if f and f != "(null)"]
    return NodeInfo(
        name=rec["NodeName"], provider_id=f"slurm://{rec['NodeName']}",
        address=rec.get("NodeAddr", ""), gpus=gpus_of(rec.get("Gres", "")), ready=ready,
        unschedulable=bool(words & UNSCHEDULABLE),
        labels={"regatta/pool": pool_name, "regatta/provider": "slurm",
                **{f"slurm/feature/{f}": "true" for f in features}},
        conditions={"Ready": "True" if ready else "False", "State": rec.get("State", ""),
                    "Reason": _reason(rec)},
        admin_hold=admin_hold(rec),
    )


def _reason(rec: dict) -> str:
    reason = rec.get("Reason", "")
    return "" if reason in ("", "(null)", "None") else reason

