"""A rank that dies is not a node that died (docs/fleet.md, "A rank that dies").

detect.py classes a node whose ranks were killed (a signal, a rank that left
no exit record) as hardware. That is right when the machine went, but the
kernel's OOM killer, or a `kill -9`, ends one process on a healthy machine:
cordoning and replacing it throws a machine away and makes the relaunch wait
for a spare. So before a killed node is taken out, the node itself must say
something is wrong with it:

- it is lost: the provider saw the process go with its node (a pod evicted
  or lost with it, `NodeProcess.node_lost`), or, asked now (the quick health
  check: the cluster pass may not have seen it yet), no longer reports it
  ready, or its row already left service;
- a health event: a critical one on it (XID, ECC, a lost node, missed
  heartbeats) since the attempt began;
- a missed node heartbeat: where the provider reports them, none within the
  heartbeat deadline;
- it failed again: a rank died on it within `process_repeat_window_s`.

With none of these, the failure is of class `process`: charged to that
class's own budget (the job's, not the node's), and relaunched on the same
nodes, nothing cordoned, nothing replaced.
"""

from __future__ import annotations

from datetime import timedelta

from clusters.models import Node, NodeEvent, NodeHealthEvent

from ..models import AttemptNode, FailureClass, JobAttempt
from .common import Ctx
from .detect import Failure

# The reason of the note a rank death leaves on its node's timeline; read back
# to find a node failing again.
RANK_DIED = "a rank died here with no sign from the node"


def settle(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> Failure:
    """The failure to act on: `failure` itself, narrowed to the nodes with
    evidence against them, or a `process` failure when none has any."""
    if (failure.cls != FailureClass.HARDWARE or failure.health_event_ids
            or not failure.nodes):
        return failure
    nodes = {n.name: n for n in Node.objects.filter(
        pk__in=AttemptNode.objects.filter(attempt=attempt, node__name__in=failure.nodes)
        .values("node_id"))}
    reported = _ask_provider(ctx)
    lost = {n["node"]: n["node_lost"] for n in failure.evidence.get("nodes", [])
            if n.get("node_lost")}
    found = {name: ({"lost": lost[name]} if name in lost
                    else _evidence(ctx, attempt, nodes.get(name), reported))
             for name in failure.nodes}
    against = [name for name in failure.nodes if found[name]]
    if against:
        failure.nodes = against
        failure.evidence["node_evidence"] = {name: found[name] for name in against}
        if "nodes" in failure.evidence:
            failure.evidence["nodes"] = [n for n in failure.evidence["nodes"]
                                         if n.get("node") in against]
        return failure
    return Failure(
        FailureClass.PROCESS,
        f"a rank on {', '.join(failure.nodes)} died ({_how(failure)}) with no sign from "
        "the node: relaunching in place",
        nodes=list(failure.nodes), exit_code=failure.exit_code, failed_at=failure.failed_at,
        evidence={**failure.evidence,
                  "health_check": {name: {"provider_ready": True, "state": nodes[name].state}
                                   for name in failure.nodes if name in nodes}},
        replace=False,
    )


def note(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> None:
    """Each node of a `process` failure keeps it on its own timeline: a
    second one there is evidence against the node."""
    for node in Node.objects.filter(pool=ctx.pool, name__in=failure.nodes):
        node.note(RANK_DIED, now=ctx.now,
                  evidence={"job": ctx.job.id, "attempt": attempt.number,
                            "exit_code": failure.exit_code, "reason": failure.reason[:300]})


def _how(failure: Failure) -> str:
    code = failure.exit_code
    if code is None:
        return "no exit status"
    return f"signal {-code}" if code < 0 else f"exit {code}"


def _ask_provider(ctx: Ctx) -> dict | None:
    """The provider's view of the pool's nodes now; None if it cannot say."""
    try:
        return {n.name: n for n in ctx.provider.list_nodes(ctx.pool_info)}
    except Exception:  # a check that cannot run confirms nothing: the node goes, as before
        return None


def _evidence(ctx: Ctx, attempt: JobAttempt, node: Node | None, reported) -> dict:
    """What the node says against itself ({} for nothing)."""
    if node is None:
        return {"lost": "the node's row is gone"}
    if reported is None:
        return {"health_check": "the provider could not be asked about the node"}
    seen = reported.get(node.name)
    if seen is None or not seen.ready:
        return {"lost": "the provider does not report the node ready"}
    if node.state != Node.State.READY:
        return {"lost": f"the node is {node.state}: {node.state_reason}"[:300]}
    since = attempt.started_at or attempt.created_at
    events = list(NodeHealthEvent.objects.filter(
        node=node, severity=NodeHealthEvent.Severity.CRITICAL, created_at__gte=since,
    ).exclude(kind=NodeHealthEvent.Kind.SPOT_NOTICE).values("id", "kind", "message")[:5])
    if events:
        return {"health_events": events}
    deadline = ctx.config.heartbeat_deadline
    if (node.last_heartbeat_at is not None
            and (ctx.now - node.last_heartbeat_at).total_seconds() > deadline):
        return {"missed_node_heartbeat": node.last_heartbeat_at.isoformat()}
    window = timedelta(seconds=ctx.config.process_repeat_window_s)
    before = (NodeEvent.objects.filter(node=node, reason=RANK_DIED,
                                       created_at__gte=ctx.now - window)
              .order_by("-created_at").first())
    if before is not None:
        return {"failed_again": {"at": before.created_at.isoformat(), **before.evidence}}
    return {}
