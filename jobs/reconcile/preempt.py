"""A spot notice or a drain on one of the attempt's nodes.

1. ask the trainer for an emergency checkpoint (a new checkpoint_request_id
   on the attempt, carried by the next heartbeat reply);
2. wait for the checkpoint with that request id, at most the cluster's
   `spot_checkpoint_wait_s`;
3. drain the node, stop the gang, replace the node (a spot notice) and
   resume from that checkpoint — a restart of class "preempted".
"""

from __future__ import annotations

import uuid
from datetime import datetime

from checkpoints.models import Checkpoint
from clusters.models import Node, NodeEvent, NodeHealthEvent
from controlplane.lib.reconcile import Result

from ..models import FailureClass, JobAttempt
from .common import Ctx
from .failures import Failure, handle


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
        pending = {"attempt": attempt.id, "node": node.name, "source": source,
                   "request_id": request_id, "requested_at": now.timestamp(),
                   "notice": notice.id if notice else None}
        ctx.set_condition("Preempting", **pending)
        if notice is not None:
            NodeHealthEvent.objects.filter(pk=notice.pk).update(handled_at=now)
        job.record("EmergencyCheckpointRequested",
                   f"{source.replace('_', ' ')} on {node.name}: asking for a checkpoint first",
                   attempt=attempt, now=now,
                   evidence={"node": node.name, "request_id": request_id, "source": source,
                             "wait_s": ctx.setting("spot_checkpoint_wait_s")})
        return Result.after(min(1.0, ctx.setting("observe_interval_s")), "checkpoint asked")
    checkpoint = Checkpoint.objects.filter(job=job, request_id=pending["request_id"]).first()
    waited = now.timestamp() - pending["requested_at"]
    if checkpoint is None and waited < ctx.setting("spot_checkpoint_wait_s"):
        return Result.after(min(1.0, ctx.setting("observe_interval_s")), "waiting for checkpoint")
    if checkpoint is not None:
        job.record("EmergencyCheckpointCommitted", f"checkpoint at step {checkpoint.step}",
                   attempt=attempt, now=now,
                   evidence={"step": checkpoint.step, "uri": checkpoint.uri,
                             "request_id": pending["request_id"],
                             "waited_s": round(waited, 3)})
    else:
        job.record("EmergencyCheckpointMissed",
                   f"no checkpoint within {ctx.setting('spot_checkpoint_wait_s'):g}s; "
                   "resuming from the newest one", attempt=attempt, now=now,
                   evidence={"request_id": pending["request_id"]})
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
    node.refresh_from_db()
    sent = NodeEvent.objects.filter(node=node, reason="drain sent to the provider",
                                    created_at__gte=node.state_changed_at).exists()
    if not sent:
        ctx.provider.drain(ctx.pool_info, node.name)
        NodeEvent.objects.create(node=node, from_state=node.state, to_state=node.state,
                                 reason="drain sent to the provider", created_at=now)
    ctx.job.record("NodeDrained", f"{node.name} drained", now=now,
                   evidence={"node": node.name, "source": source})
