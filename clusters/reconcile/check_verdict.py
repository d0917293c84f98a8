"""A health check that fails everywhere blames the check, not the nodes.

A preflight is evidence against a node only when it tells nodes apart. One
that fails on every node alike (a DCGM host engine that is not running, a
port the check cannot open, a CUDA the check's image does not match) would
otherwise cordon each node it touches: every spare in turn as it joins,
with a new one provisioned after it, and every gang at its launch. So:

- a gang of two or more whose every node failed with the same error, or
- the same error on `SUSPECT_AFTER_NODES` different nodes within
  `WINDOW_S`

makes the check suspect for that error: no node is blamed for it, the
cluster carries a `PreflightSuspect` condition that says so (operators fix
the check), and spares are not checked again while it lasts. A node that
fails with an error of its own is still blamed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusters.models import Cluster

CONDITION = "PreflightSuspect"
FAILURES = "PreflightFailures"
SUSPECT_AFTER_NODES = 3
WINDOW_S = 3600.0
# While the check is suspect, spares are not checked (each check costs a
# cluster pass its time); it is tried again after this long.
SUSPECT_FOR_S = 600.0


@dataclass(frozen=True)
class Verdict:
    blamed: tuple[str, ...]  # nodes the check's evidence holds against
    suspect: str = ""  # the error the check itself is suspected of, if any


def _normalize(error: str) -> str:
    return re.sub(r"\d+", "#", (error or "").strip())[:200]


def judge(cluster: Cluster, result, checked: list[str], now) -> Verdict:
    """Which of `result.failed_nodes` the check blames, remembering the
    failures on the cluster so that a check failing everywhere is seen."""
    failed = list(result.failed_nodes)
    if not failed:
        return Verdict(())
    errors = {name: _normalize(result.node_check(name).get("error") or result.message)
              for name in failed}
    cluster.refresh_from_db(fields=["conditions"])
    conditions = [c for c in cluster.conditions or [] if c.get("type") != FAILURES]
    seen = next((c for c in cluster.conditions or [] if c.get("type") == FAILURES), {})
    recent = {err: entry for err, entry in (seen.get("errors") or {}).items()
              if now.timestamp() - entry.get("at", 0) <= WINDOW_S}
    for name, err in errors.items():
        entry = recent.setdefault(err, {"nodes": [], "at": now.timestamp()})
        entry["nodes"] = sorted({*entry["nodes"], name})[-20:]
        entry["at"] = now.timestamp()
    suspect = {err for err, entry in recent.items()
               if len(entry["nodes"]) >= SUSPECT_AFTER_NODES}
    alike = len(set(errors.values())) == 1
    if len(checked) >= 2 and set(failed) == set(checked) and alike:
        suspect.add(next(iter(errors.values())))
    conditions.append({"type": FAILURES, "errors": recent})
    if suspect:
        conditions = [c for c in conditions if c.get("type") != CONDITION]
        err = sorted(suspect)[0]
        nodes = recent.get(err, {}).get("nodes", failed)
        conditions.append({
            "type": CONDITION, "error": err, "nodes": nodes,
            "until": now.timestamp() + SUSPECT_FOR_S,
            "message": f"the preflight fails alike on {len(nodes)} nodes ({err}): the check "
                       "is suspect, not the nodes; fix the check"})
    Cluster.objects.filter(pk=cluster.pk).update(conditions=conditions)
    cluster.conditions = conditions
    blamed = tuple(name for name in failed if errors[name] not in suspect)
    return Verdict(blamed, sorted(suspect)[0] if suspect else "")


def check_suspect(cluster: Cluster, now) -> dict | None:
    """The cluster's PreflightSuspect condition while it lasts."""
    found = next((c for c in cluster.conditions or [] if c.get("type") == CONDITION), None)
    if found is None or found.get("until", 0) < now.timestamp():
        return None
    return found
