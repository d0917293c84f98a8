"""A spot notice or a drain on one of the attempt's nodes.

1. ask the trainer for an emergency checkpoint (a new checkpoint_request_id
   on the attempt, carried by the next heartbeat reply);
2. wait for the checkpoint with that request id, at most the cluster's
   `spot_checkpoint_wait_s`, and never past the notice's own deadline less
   `spot_deadline_margin_s` (time to stop the gang before the machine goes);
3. drain the node, stop the gang, replace the node (a spot notice) and
   resume from that checkpoint — a restart of class "preempted".
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.utils.dateparse import parse_datetime

from checkpoints.models import Checkpoint
from clusters.acts import send_drain
from clusters.models import Node, NodeHealthEvent
from controlplane.lib.reconcile import Result
from jobs.context import Ctx
from jobs.models import FailureClass, JobAttempt
from jobs.recovery.detect import Failure
from jobs.recovery.handle import handle

# EC2 warns two minutes before it acts; its EventBridge warning, and the taint
# Node Termination Handler sets from it, carry when the warning came.
EC2_NOTICE_LEAD_S = 120.0
EC2_WARNING = "EC2 Spot Instance Interruption Warning"
NTH_SPOT_TAINT = "aws-node-termination-handler/spot-itn"


def _timestamp(raw) -> float | None:
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        parsed = parse_datetime(raw)
        return parsed.timestamp() if parsed is not None and parsed.tzinfo else None
    return None


def notice_deadline(notice: NodeHealthEvent) -> float | None:
    """When the notice says the machine goes (a Unix time), if it says.

    Providers give it as `deadline`; the instance-action shape (`action`,
    `time`: the local provider's, EC2 metadata's) as `time`; EC2's warning
    event and NTH's taint as the time of the warning, two minutes before."""
    ev = notice.evidence or {}
    if ev.get("deadline") is not None:
        return _timestamp(ev["deadline"])
    if ev.get("detail_type") == EC2_WARNING:
        sent = _timestamp(ev.get("time"))
        return sent + EC2_NOTICE_LEAD_S if sent is not None else None
    taint = ev.get("taint") or {}
    if isinstance(taint, dict) and taint.get("key") == NTH_SPOT_TAINT:
        sent = _timestamp(taint.get("timeAdded"))
        return sent + EC2_NOTICE_LEAD_S if sent is not None else None
    if ev.get("action"):
        return _timestamp(ev.get("time"))
    return None


def _wait_s(ctx: Ctx, notice: NodeHealthEvent | None) -> tuple[float, float | None]:
    """(seconds to wait for the checkpoint, the notice's deadline or None)."""
    wait = ctx.config.spot_checkpoint_wait_s
    deadline = notice_deadline(notice) if notice is not None else None
    if deadline is None:
        return wait, None
    margin = ctx.config.spot_deadline_margin_s
    return max(0.0, min(wait, deadline - margin - ctx.now.timestamp())), deadline


def _trigger(attempt: JobAttempt):
    """(node, source, health event or None) for the first node that must go."""
    node_ids = list(attempt.placements.values_list("node_id", flat=True))
    notice = (
        NodeHealthEvent.objects.filter(node_id__in=node_ids, kind=NodeHealthEvent.Kind.SPOT_NOTICE,
                                       handled_at__isnull=True)
        .select_related("node").order_by("created_at").first()
    )
    if notice is not None:
        return notice.node, "spot_notice", notice
    draining = Node.objects.filter(pk__in=node_ids, state=Node.State.DRAINING).first()
    if draining is not None:
        return draining, "drain", None
    return None, None, None


def check(ctx: Ctx, attempt: JobAttempt) -> Result | None:
    job, now = ctx.job, ctx.now
    pending = ctx.condition("Preempting")
    if pending is None or pending.get("attempt") != attempt.id:
        node, source, notice = _trigger(attempt)
        if node is None:
            return None
        request_id = uuid.uuid4().hex
        JobAttempt.objects.filter(pk=attempt.pk).update(
            checkpoint_request_id=request_id, checkpoint_requested_at=now
        )
        wait_s, deadline = _wait_s(ctx, notice)
        pending = {"attempt": attempt.id, "node": node.name, "source": source,
                   "request_id": request_id, "requested_at": now.timestamp(),
                   "notice": notice.id if notice else None, "wait_s": wait_s,
                   "deadline": deadline}
        ctx.set_condition("Preempting", **pending)
        if notice is not None:
            NodeHealthEvent.objects.filter(pk=notice.pk).update(handled_at=now)
        job.record("EmergencyCheckpointRequested",
                   f"{source.replace('_', ' ')} on {node.name}: asking for a checkpoint first",
                   attempt=attempt, now=now,
                   evidence={"node": node.name, "request_id": request_id, "source": source,
                             "wait_s": round(wait_s, 3), "deadline": deadline})
        return Result.after(min(1.0, ctx.config.observe_interval_s, wait_s),
                            "checkpoint asked")
    checkpoint = Checkpoint.objects.filter(job=job, request_id=pending["request_id"]).first()
    waited = now.timestamp() - pending["requested_at"]
    wait_s = pending.get("wait_s", ctx.config.spot_checkpoint_wait_s)
    if checkpoint is None and waited < wait_s:
        return Result.after(min(1.0, ctx.config.observe_interval_s, wait_s - waited),
                            "waiting for checkpoint")
    if checkpoint is not None:
        job.record("EmergencyCheckpointCommitted", f"checkpoint at step {checkpoint.step}",
                   attempt=attempt, now=now,
                   evidence={"step": checkpoint.step, "uri": checkpoint.uri,
                             "request_id": pending["request_id"],
                             "waited_s": round(waited, 3)})
    else:
        job.record("EmergencyCheckpointMissed",
                   f"no checkpoint within {wait_s:.3g}s; resuming from the newest one",
                   attempt=attempt, now=now,
                   evidence={"request_id": pending["request_id"], "wait_s": wait_s,
                             "deadline": pending.get("deadline")})
    node = Node.objects.get(cluster=ctx.cluster, name=pending["node"])
    _drain(ctx, node, pending["source"], now)
    failure = Failure(
        FailureClass.PREEMPTED,
        f"{pending['source'].replace('_', ' ')} on {node.name}",
        nodes=[node.name], exit_code=None, replace=pending["source"] == "spot_notice",
        evidence={"node": node.name, "source": pending["source"],
                  "checkpoint_step": checkpoint.step if checkpoint else None},
    )
    ctx.clear_condition("Preempting")
    return handle(ctx, attempt, failure)


def _drain(ctx: Ctx, node: Node, source: str, now: datetime) -> None:
    if node.state == Node.State.READY or node.state == Node.State.CORDONED:
        node.drain(f"{source.replace('_', ' ')}: emergency checkpoint taken", now=now)
    send_drain(node, ctx.provider, ctx.pool_info, now)
    ctx.job.record("NodeDrained", f"{node.name} drained", now=now,
                   evidence={"node": node.name, "source": source})
