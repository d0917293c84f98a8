"""Handle an attempt's failure (found by detect.py): stop the gang, book
goodput, cordon and replace bad nodes, then restart within the class's
budget or fail with the evidence.
"""

from __future__ import annotations

from checkpoints.models import Checkpoint
from clusters.acts import take_out
from clusters.models import Node, NodeHealthEvent
from controlplane.lib.reconcile import Result
from jobs import goodput
from jobs.context import Ctx
from jobs.recovery import budgets, crash_loop, evidence

from ..models import FailureClass, JobAttempt, Phase
from .detect import Failure, health_evidence

# Classes whose bad nodes leave service (cordoned, replaced from the spares).
REPLACES_NODES = (FailureClass.HARDWARE, FailureClass.HANG)


def _rollback_seconds(ctx: Ctx, attempt: JobAttempt, failed_at) -> tuple[float, int | None]:
    if attempt.first_step_at is None:
        return 0.0, None
    checkpoint = (Checkpoint.objects.filter(job=ctx.job, state__in=Checkpoint.LOADABLE)
                  .order_by("-step").first())
    since = attempt.first_step_at
    if checkpoint is not None and checkpoint.created_at > since:
        since = checkpoint.created_at
    return max(0.0, (failed_at - since).total_seconds()), checkpoint.step if checkpoint else None


def handle(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> Result:
    """End the attempt, take its bad nodes out, then restart within the
    class's budget or fail with the evidence."""
    fallback_step = end_attempt(ctx, attempt, failure)
    if fallback_step is ENDED_ALREADY:
        return Result.after(0.5, "attempt already ended")
    if (failure.cls == FailureClass.PREEMPTED and attempt.stop_requested_at is not None
            and not failure.evidence.get("source")):
        # Ranks that exit 83 because the control plane stopped them.
        failure.evidence["source"] = "control_plane_stop"
    # Read before taking the nodes out counts this failure against them.
    fresh = on_fresh_nodes(ctx, failure)
    record_node_failures(ctx, attempt, failure)
    if failure.cls == FailureClass.PROCESS and not failure.evidence.get("program"):
        # A rank killed with no sign from its node: the node remembers it.
        # (A program that failed by itself says nothing about its nodes.)
        evidence.note_rank_deaths(ctx, attempt, failure)
    if takes_nodes_out(failure):
        _take_out(ctx, attempt, failure)
    return decide_restart(ctx, attempt, failure, fallback_step, fresh=fresh)


def failed_nodes(ctx: Ctx, failure: Failure):
    """The pool's nodes the failure names: where its ranks really ran, as the
    provider observed them (a scheduler may place a rank elsewhere than
    planned), not the attempt's plan."""
    return Node.objects.filter(pool=ctx.pool, name__in=failure.nodes)


def on_fresh_nodes(ctx: Ctx, failure: Failure) -> bool:
    """Whether every node the failure is pinned to had no failure on record."""
    if not failure.nodes:
        return False
    counts = failed_nodes(ctx, failure).values_list("failure_count", flat=True)
    return bool(counts) and not any(counts)


# How long a failed gang's survivors get to hand over the last completed
# step before they are killed (worker_image/regatta/checkpoint.py).
HANDOVER_GRACE_S = 5.0

# `end_attempt`'s answer when another pass ended the attempt first.
ENDED_ALREADY = object()


def takes_nodes_out(failure: Failure) -> bool:
    return failure.replace and failure.cls in (*REPLACES_NODES, FailureClass.PREEMPTED)


def end_attempt(ctx: Ctx, attempt: JobAttempt, failure: Failure):
    """Stop the gang, mark the attempt failed and book its time; returns the
    step the job falls back to (None: the start), or ENDED_ALREADY."""
    now = ctx.now
    try:
        # The gang is broken (or its emergency checkpoint is taken): no
        # grace for a checkpoint, which a dead peer could never join. But
        # the survivors of a peer's death write the last step they completed
        # (a hand-over, no collective) and exit: a few seconds let them
        # finish, and cost nothing when they exit at once. Silent ranks
        # (a hang) would only use them up.
        grace = 1.0 if failure.cls == FailureClass.HANG else HANDOVER_GRACE_S
        ctx.provider.stop(attempt.provider_ref, grace_s=grace)
    except Exception as exc:  # the attempt ends in our books either way; the
        failure.evidence["stop_error"] = str(exc)[:300]  # next launch uses other names
    if not attempt.end(JobAttempt.State.FAILED, now, exit_code=failure.exit_code,
                       failure_class=failure.cls, failure_reason=failure.reason[:2000]):
        return ENDED_ALREADY
    if takes_nodes_out(failure):
        _attach_health_events(ctx, failure)
    if failure.health_event_ids:
        NodeHealthEvent.objects.filter(pk__in=failure.health_event_ids).update(handled_at=now)
    rollback_s, fallback_step = _rollback_seconds(ctx, attempt, failure.failed_at or now)
    # Steps lost: from the newest step the ranks reported to the one the
    # job falls back to (0 when survivors handed over the last one).
    lost = max(0, (attempt.last_step or 0) - (fallback_step or 0))
    goodput.book_attempt_end(ctx.job, attempt, ended_at=now, rollback_s=rollback_s,
                             hang_s=failure.hang_s,
                             detail=f"rolled back to step {fallback_step}: {lost} steps lost")
    return fallback_step


def record_node_failures(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> None:
    per_node = failure.evidence.get("nodes") or [
        {"node": name, **failure.evidence} for name in failure.nodes
    ]
    # Ranks that checkpointed and exited 83 on a drain or a spot notice did
    # what was asked of them; calling that a failed node misleads operators.
    # A rank that died on a healthy node is not a failed node either.
    kind = {FailureClass.PREEMPTED: "NodePreempted",
            FailureClass.PROCESS: "RankDied"}.get(failure.cls, "NodeFailed")
    if failure.cls == FailureClass.HANG and not failure.replace:
        kind = "RanksSilent"  # a suspect, not a failed node (jobs/recovery/evidence.py)
    for node_evidence in per_node:
        ctx.job.record(kind, f"{node_evidence['node']}: {failure.reason}"[:500],
                       attempt=attempt, now=ctx.now,
                       evidence={**node_evidence, "class": failure.cls})


def decide_restart(ctx: Ctx, attempt: JobAttempt, failure: Failure,
                   fallback_step: int | None, *, fresh: bool = False) -> Result:
    job, now = ctx.job, ctx.now
    counts = dict(job.restart_counts or {})
    counts[failure.cls] = counts.get(failure.cls, 0) + 1
    charge = budgets.charge(job, failure, fresh=fresh, now=now)
    run = crash_loop.extend(job, attempt, failure, crash_loop.signature_of(failure))
    if run is not None:
        charge.marks[crash_loop.MARK] = run.as_mark()
        if run.count >= ctx.config.crash_loop_failures:
            return _fail_crash_loop(ctx, attempt, failure, counts, charge, run)
    if charge.exhausted:
        return _fail(ctx, attempt, failure, counts, charge)
    backoff = _backoff_s(ctx, failure, counts[failure.cls])
    if backoff:
        ctx.set_condition("RestartBackoff", until=now.timestamp() + backoff, seconds=backoff)
    ctx.set_condition("LastFailure", attempt=attempt.number, failure_class=failure.cls,
                      reason=failure.reason[:300], at=now.isoformat(),
                      fallback_step=fallback_step)
    spent = charge.spent.get(failure.cls, 0)
    job.transition(
        Phase.RESTARTING, reason="Restarting", attempt=attempt, now=now,
        message=f"{failure.cls}: {failure.reason}"[:1000]
        + (f"; retrying in {backoff:g}s" if backoff else "")
        # The timeline says who paid, so a reader need not open the evidence.
        + ("" if charge.charged_to_job else f"; not charged to the job ({charge.why})"),
        evidence={"class": failure.cls, "restarts": counts[failure.cls], "spent": spent,
                  "budget": charge.budget, "charged_to_job": charge.charged_to_job,
                  "why": charge.why, "window_reset": charge.reset,
                  "backoff_s": backoff, "fallback_step": fallback_step, **failure.evidence},
        restart_counts=counts, budget_spent=charge.spent, restart_marks=charge.marks,
        last_error=failure.reason[:5000],
    )
    return Result.after(backoff, "restarting")


def _backoff_s(ctx: Ctx, failure: Failure, count: int) -> float:
    if failure.cls != FailureClass.TRANSIENT:
        return 0.0
    cfg = ctx.config
    return min(cfg.transient_backoff_max_s, cfg.transient_backoff_s * 2 ** (count - 1))


def _fail(ctx: Ctx, attempt: JobAttempt, failure: Failure, counts: dict,
          charge: budgets.Charge) -> Result:
    now = ctx.now
    budget = charge.budget
    blame = f" ({charge.why})" if budgets.is_pinned(failure) else ""
    error = (f"{failure.cls} failure with the '{failure.cls}' restart budget spent "
             f"({charge.spent[failure.cls] - 1} of {budget} restarts used){blame}: "
             f"{failure.reason}")
    ctx.release_nodes(Phase.FAILED, attempt, reason="Failed", message=error,
                      evidence={"class": failure.cls, "budget": budget, "why": charge.why,
                                "restarts": counts[failure.cls], **failure.evidence},
                      last_error=error[:5000], finished_at=now, restart_counts=counts,
                      budget_spent=charge.spent, restart_marks=charge.marks)
    return Result.done("failed")


def _fail_crash_loop(ctx: Ctx, attempt: JobAttempt, failure: Failure, counts: dict,
                     charge: budgets.Charge, run: crash_loop.Run) -> Result:
    """The same failure again and again, with no progress: the program's
    bug. The job ends with its own error line and the lines around it."""
    now = ctx.now
    error = failure.evidence.get("error") or {}
    where = (f" on {len(run.nodes)} different nodes" if run.elsewhere
             else f" on {run.nodes[0]}" if run.nodes else "")
    said = error.get("line") or f"no error line in the log ({failure.reason})"
    message = (f"crash loop: the same failure {run.count} times in a row{where} "
               f"(attempts {', '.join(map(str, run.attempts))}), no step past "
               f"{run.step}: {said}")
    detail = "\n".join(error.get("lines") or [])
    ctx.release_nodes(Phase.FAILED, attempt, reason="CrashLoop", message=message[:1000],
                      evidence={"class": failure.cls, "signature": run.signature,
                                "failures": run.count, "nodes": list(run.nodes),
                                "attempts": list(run.attempts), "error": error,
                                "exit_code": failure.exit_code},
                      last_error=(message + ("\n\n" + detail if detail else ""))[:5000],
                      finished_at=now, restart_counts=counts, budget_spent=charge.spent,
                      restart_marks=charge.marks)
    return Result.done("crash loop")


def _attach_health_events(ctx: Ctx, failure: Failure) -> None:
    """Open critical health events of the nodes this failure takes out (a
    "lost" node, an XID seen after its ranks died) are part of its evidence,
    and handled by it: the node leaves service for them too."""
    events = list(
        NodeHealthEvent.objects.filter(
            node__in=failed_nodes(ctx, failure),
            handled_at__isnull=True, severity=NodeHealthEvent.Severity.CRITICAL,
        ).exclude(kind=NodeHealthEvent.Kind.SPOT_NOTICE)
        .exclude(pk__in=failure.health_event_ids).select_related("node").order_by("id")
    )
    if not events:
        return
    failure.health_event_ids = [*failure.health_event_ids, *(e.id for e in events)]
    found = [health_evidence(e) for e in events]
    failure.evidence["health_events"] = [*failure.evidence.get("health_events", []), *found]
    for node_evidence in failure.evidence.get("nodes") or []:
        mine = [e for e in found if e["node"] == node_evidence.get("node")]
        if mine:
            node_evidence["health_events"] = mine


def _take_out(ctx: Ctx, attempt: JobAttempt, failure: Failure) -> None:
    """Each bad node leaves service with the evidence on the job's timeline:
    cordoned (or, if something else took it out first, why it is out), then
    replaced from the spare pool."""
    job, now = ctx.job, ctx.now
    for node in failed_nodes(ctx, failure):
        kind = (NodeHealthEvent.Kind.MISSED_HEARTBEAT if failure.cls == FailureClass.HANG
                else None)
        evidence = {"job": job.id, "attempt": attempt.number, "class": failure.cls,
                    "reason": failure.reason[:300]}
        was = node.state
        before = node.events.order_by("-created_at", "-id").first()
        out = take_out(node, f"{failure.cls}: {failure.reason}"[:300], evidence, now,
                       replace_reason=f"replaced after a {failure.cls} failure",
                       health_kind=kind, count_failure=failure.cls != FailureClass.PREEMPTED,
                       ask_provider=False)
        if out.cordoned:
            job.record("NodeCordoned", f"{node.name} cordoned", attempt=attempt, now=now,
                       evidence={"node": node.name, "was": was, **evidence,
                                 **_node_failure_event(node, was)})
        else:
            job.record("NodeOutOfService", f"{node.name} is already {was}",
                       attempt=attempt, now=now,
                       evidence={"node": node.name, "state": was, **evidence,
                                 "node_event": _event_evidence(before)})
        spare, provisioned = out.spare, out.provisioned
        job.record(
            "NodeReplaced",
            f"{node.name} replaced by {spare.name if spare else 'no spare (none ready)'}",
            attempt=attempt, now=now,
            evidence={"old": node.name, "new": spare.name if spare else None,
                      "provisioned": provisioned.name if provisioned else None},
        )


def _node_failure_event(node: Node, was: str) -> dict:
    """A node the provider had reported failed: that report is evidence too."""
    if was != Node.State.FAILED:
        return {}
    reported = node.events.filter(to_state=Node.State.FAILED).order_by("-created_at", "-id")
    return {"provider_report": _event_evidence(reported.first())}


def _event_evidence(event) -> dict | None:
    if event is None:
        return None
    return {"id": event.id, "from": event.from_state, "to": event.to_state,
            "reason": event.reason, "evidence": event.evidence,
            "at": event.created_at.isoformat()}
