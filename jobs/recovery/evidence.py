"""Attribution: which nodes, if any, a failure's evidence points at.

detect.py classes a node whose ranks were killed (a SIGKILL, a rank that left
no exit record) as hardware, and a node whose ranks went silent as a hang.
Either only makes the node a suspect: the kernel's OOM killer ends one
process on a healthy machine, and a program's own deadlock silences its
ranks on every node. A node leaves service only when the node itself says
something is wrong with it:

- it is lost: the provider saw the process go with its node
  (`NodeProcess.node_lost`), or, asked now, no longer lists it or reports
  it not ready, or its row left service already;
- a health event: a critical one on it (XID, ECC, lost, a failed check)
  since the attempt began; missed node heartbeats are the scheduler's to
  report (a kubelet's NotReady, a slurmd not responding: not ready above),
  not the job's ranks going silent there.

Not evidence against a node:
- the provider could not be asked (an API server stalled): nothing is known;
- it failed again (a rank died there within `process_repeat_window_s`, or
  it went silent): that makes it a suspect, health-checked before the
  relaunch uses it (its preflight pass is cleared, so the launch checks it:
  jobs/reconcile/launch.py); a node that fails that check is cordoned then,
  with the check's evidence, and one that passes stays in service;
- the same failure seen on other nodes before: that is the program's, and
  its suspects are not even checked.

A job's failures may cost the fleet at most `max_nodes_retired_by_job`
nodes through such checks (the job's own leftovers can fail a check too),
and never its whole gang. With no node evidence, a killed rank's failure is
of class `process` (the job's budget), relaunched in place.
"""

from __future__ import annotations

from datetime import timedelta

from clusters.models import Node, NodeEvent, NodeHealthEvent
from jobs.context import Ctx
from jobs.models import FailureClass, JobAttempt
from jobs.recovery.detect import Failure

from . import crash_loop

# The reason of the note a rank death leaves on its node's timeline; read back
# to find a node failing again.
RANK_DIED = "a rank died here with no sign from the node"
# The job condition naming the nodes its last failure made suspects: the
# launch that checks them charges a failed check to the job's bound.
SUSPECTS = "Suspects"
# restart_marks' key for the nodes the job's suspicion took out.
RETIRED_BY_JOB = "retired_by_job"


def attribute(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> Failure:
    """The failure to act on: narrowed to the nodes with evidence against
    them, or (with none) one that retires nothing: a killed rank's becomes a
    `process` failure, a hang relaunches in place."""
    if (failure.cls not in (FailureClass.HARDWARE, FailureClass.HANG)
            or failure.health_event_ids or not failure.nodes):
        return failure
    # The same failure on other nodes just before: the program's.
    seen_elsewhere = crash_loop.seen_on_other_nodes(
        ctx.job, crash_loop.signature_of(failure), failure.nodes)
    rows = {n.name: n for n in Node.objects.filter(pool=ctx.pool, name__in=failure.nodes)}
    reported = _ask_provider(ctx)
    lost = {n["node"]: n["node_lost"] for n in failure.evidence.get("nodes", [])
            if n.get("node_lost")}
    found = {name: ({"lost": lost[name]} if name in lost
                    else _against(ctx, attempt, rows.get(name), reported))
             for name in failure.nodes}
    against = [name for name in failure.nodes if found[name]]
    cleared = [name for name in failure.nodes if not found[name]]
    checked = _suspect(ctx, attempt, failure, [rows[n] for n in cleared if n in rows],
                       seen_elsewhere=seen_elsewhere)
    if against:
        failure.nodes = against
        failure.evidence["node_evidence"] = {name: found[name] for name in against}
        if "nodes" in failure.evidence:
            failure.evidence["nodes"] = [n for n in failure.evidence["nodes"]
                                         if n.get("node") in against]
        if checked:
            failure.evidence["suspects"] = checked
        return failure
    health = {name: _health_check(rows.get(name), reported) for name in cleared}
    if failure.cls == FailureClass.HANG:
        failure.replace = False
        failure.evidence.update(health_check=health, suspects=checked)
        failure.reason += "; no sign from the nodes: relaunching in place"
        return failure
    return Failure(
        FailureClass.PROCESS,
        f"a rank on {', '.join(failure.nodes)} died ({how(failure.exit_code)}) with no sign "
        "from the node: relaunching in place",
        nodes=list(failure.nodes), exit_code=failure.exit_code, failed_at=failure.failed_at,
        evidence={**failure.evidence, "health_check": health, "suspects": checked},
        replace=False,
    )


def note_rank_deaths(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> None:
    """Each node of a `process` failure keeps it on its own timeline: a
    second one there makes the node a suspect."""
    for node in Node.objects.filter(pool=ctx.pool, name__in=failure.nodes):
        node.note(RANK_DIED, now=ctx.now,
                  evidence={"job": ctx.job.id, "attempt": attempt.number,
                            "exit_code": failure.exit_code, "reason": failure.reason[:300]})


def how(exit_code: int | None) -> str:
    if exit_code is not None and exit_code < 0:
        return f"signal {-exit_code}"
    return f"exit {exit_code}"


def _ask_provider(ctx: Ctx) -> dict | None:
    """The provider's view of the pool's nodes now; None if it cannot say."""
    try:
        return {n.name: n for n in ctx.provider.list_nodes(ctx.pool_info)}
    except Exception:  # a check that cannot run confirms nothing, either way
        return None


def _against(ctx: Ctx, attempt: JobAttempt, node: Node | None, reported) -> dict:
    """What the node says against itself ({} for nothing)."""
    if node is None:
        return {}  # not a node of the pool (a scheduler's own pick): nothing to take out
    if reported is not None:
        seen = reported.get(node.name)
        if seen is None or not seen.ready:
            return {"lost": "the provider does not report the node ready"}
    held = node.state == Node.State.CORDONED and node.admin_hold
    if node.state != Node.State.READY and not held:
        # Out of service already, for a fault or a person's judgment (an
        # admin's hold in the scheduler is maintenance, not a fault).
        return {"lost": f"the node is {node.state}: {node.state_reason}"[:300]}
    since = attempt.started_at or attempt.created_at
    events = list(NodeHealthEvent.objects.filter(
        node=node, severity=NodeHealthEvent.Severity.CRITICAL, created_at__gte=since,
    ).exclude(kind=NodeHealthEvent.Kind.SPOT_NOTICE).values("id", "kind", "message")[:5])
    if events:
        return {"health_events": events}
    # Node.last_heartbeat_at is when the job's own ranks on the node were
    # last heard from: their silence is the job's evidence (a suspect), not
    # the node's. The node's own heartbeats are the scheduler's to judge
    # (a kubelet's NotReady, a slurmd not responding: `reported` above).
    return {}


def _health_check(node: Node | None, reported) -> dict:
    if node is None:
        return {"in_pool": False}
    return {"provider_ready": None if reported is None else True, "state": node.state}


def _suspect(ctx: Ctx, attempt: JobAttempt, failure: Failure, nodes: list[Node], *,
             seen_elsewhere: bool) -> list[str]:
    """Mark the nodes that failed again (or went silent) with no evidence as
    suspects, checked before the relaunch uses them; returns their names."""
    if not nodes:
        return []
    if failure.cls == FailureClass.HANG:
        suspects = nodes
    else:
        window = timedelta(seconds=ctx.config.process_repeat_window_s)
        again = set(NodeEvent.objects.filter(
            node__in=nodes, reason=RANK_DIED, created_at__gte=ctx.now - window,
        ).values_list("node_id", flat=True))
        suspects = [n for n in nodes if n.id in again]
    gang = attempt.placements.count()
    if not suspects or seen_elsewhere or len(suspects) >= gang:
        return []  # the program's: its failure, not its nodes'
    retired = list((ctx.job.restart_marks or {}).get(RETIRED_BY_JOB) or [])
    if len(retired) >= ctx.config.max_nodes_retired_by_job:
        return []
    names = [n.name for n in suspects]
    Node.objects.filter(pk__in=[n.pk for n in suspects]).update(preflight_passed_at=None)
    for node in suspects:
        node.note("suspect: checked before its next use", now=ctx.now,
                  evidence={"job": ctx.job.id, "attempt": attempt.number,
                            "class": failure.cls, "reason": failure.reason[:300]})
    ctx.set_condition(SUSPECTS, attempt=attempt.number, nodes=names)
    return names


def charge_check(ctx: Ctx, node_name: str) -> bool:
    """A node the job's suspicion had checked failed the check: it counts
    against the job's bound. False when the node was no suspect of the job."""
    suspects = ctx.condition(SUSPECTS) or {}
    if node_name not in (suspects.get("nodes") or ()):
        return False
    marks = dict(ctx.job.restart_marks or {})
    retired = list(marks.get(RETIRED_BY_JOB) or [])
    if node_name not in retired:
        retired.append(node_name)
    marks[RETIRED_BY_JOB] = retired
    type(ctx.job).objects.filter(pk=ctx.job.pk).update(restart_marks=marks)
    ctx.job.restart_marks = marks
    return True
