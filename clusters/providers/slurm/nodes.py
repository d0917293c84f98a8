"""Slurm's nodes as the provider protocol sees them.

A node's `State` is a base state and flags: `IDLE`, `ALLOCATED+DRAIN`,
`DOWN+NOT_RESPONDING`, `IDLE*` (`*`: slurmd is not answering). Regatta's
cordon is Slurm's DRAIN; a node Slurm calls DOWN or FAIL is not ready, and is
reported as a lost node with Slurm's own reason as the evidence.
"""

from __future__ import annotations

import re

from ..base import HealthSignal, NodeInfo

# Not responding alone is not yet a loss: slurmd may answer again before
# SlurmdTimeout, and Slurm itself calls the node DOWN only then.
NOT_READY = frozenset({"DOWN", "FAIL", "FAILING", "FUTURE", "INVAL", "UNKNOWN",
                       "POWERED_DOWN", "POWERING_DOWN", "REBOOT_ISSUED"})
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
    )


def _reason(rec: dict) -> str:
    reason = rec.get("Reason", "")
    return "" if reason in ("", "(null)", "None") else reason


def lost_signal(rec: dict) -> HealthSignal | None:
    """A node Slurm calls DOWN or FAILed, with Slurm's reason
    and when it was given: the key makes one event per loss, however often
    the node is listed."""
    words = state_words(rec.get("State", ""))
    if not words & LOST:
        return None
    name = rec["NodeName"]
    reason = _reason(rec) or "no reason given"
    return HealthSignal(
        node=name, kind="lost", severity="critical",
        message=f"Slurm reports {name} {rec.get('State', '')}: {reason}"[:500],
        evidence={"slurm_state": rec.get("State", ""), "slurm_reason": reason,
                  "reason_time": rec.get("ReasonTime", ""),
                  "slurmd_start_time": rec.get("SlurmdStartTime", "")},
        key=f"slurm-lost/{name}/{rec.get('ReasonTime') or rec.get('SlurmdStartTime', '')}",
    )
