"""The scheduler's view of a node is the truth Regatta follows, both ways.

The cluster pass reads every node from the provider (Slurm, Kubernetes, the
local book) and keeps the node's row in step with it:

- an admin's hold (a Slurm drain or down with their reason, a `kubectl
  cordon`: `NodeInfo.admin_hold`) takes the node out of Regatta's placement
  at once, cordoned with their words, and their resume brings it back;
- a node the provider reports not ready fails only once that lasted the
  cluster's `node_failure_grace_s`: a scheduler's restart (Slurm's UNKNOWN
  for a second, Kubernetes' NodeStatusUnknown after an API-server stall) is
  no failure. When it does fail, a `lost` health event carries the
  provider's own words: the node-level evidence the jobs on it act on;
- a node out of service that its owner mends and resumes (seen held or down
  at the provider, then available there again) starts a return to service,
  which puts it back once a health check passes (returns.py).
"""

from __future__ import annotations

import logging

from django.db.models import F

from clusters.models import Node, NodeEvent, NodeHealthEvent
from clusters.providers import get_provider, pool_info
from clusters.providers.capabilities import ClaimsCordons
from controlplane.lib.bulk import insert_rows, update_by_ids
from controlplane.lib.transitions import event_time

from .. import wake
from .replacement import take_out
from .returns import request_return

log = logging.getLogger(__name__)

# The start of the reason of a cordon that follows the scheduler's hold:
# read back to know the cordon is the hold's, lifted with it.
HELD = "held by the scheduler"
SCHEDULER = "scheduler"


def follow(row: Node, seen, grace_s: float, now) -> None:
    """Bring `row` in step with `seen`, the provider's NodeInfo of it. Reads
    the row as the pass loaded it, and writes only what changed: a quiet
    fleet's pass makes no query here."""
    _follow_hold(row, seen, now)
    _follow_readiness(row, seen, grace_s, now)
    _follow_mend(row, seen, now)


def _follow_hold(row: Node, seen, now) -> None:
    hold = (seen.admin_hold or "")[:300]
    if hold and not row.admin_hold and _taken_out_by_regatta(row):
        # Regatta's own hold, which the provider cannot tell apart: a
        # Kubernetes cordon made before Regatta marked its cordons. Marked
        # now where the provider can, so its return lifts it.
        _claim_cordon(row)
        hold = ""
    if hold == row.admin_hold:
        return
    Node.objects.filter(pk=row.pk).update(admin_hold=hold)
    was = row.admin_hold
    row.admin_hold = hold
    if hold:
        if row.state == Node.State.READY:
            row.transition(Node.State.CORDONED, reason=f"{HELD}: {hold}", actor=SCHEDULER,
                           now=now, evidence={"admin_hold": hold,
                                              "provider_status": seen.conditions},
                           still_in=(Node.State.READY,))
        elif not was:
            row.note(f"{HELD} too: {hold}", now=now,
                     evidence={"admin_hold": hold, "provider_status": seen.conditions})
        # A return under way waits for the hold to lift, then starts again.
        Node.objects.filter(pk=row.pk).update(return_requested_at=None, return_requested_by="")
        return
    if row.state == Node.State.CORDONED and row.state_reason.startswith(HELD):
        row.transition(Node.State.READY, reason=f"the scheduler's hold lifted ({was})",
                       actor=SCHEDULER, now=now, evidence={"was": was},
                       still_in=(Node.State.CORDONED,))
    else:
        row.note(f"the scheduler's hold lifted ({was})", now=now, evidence={"was": was})


# Taken out of service through Regatta's own acts, which hold the node at
# the provider (a take-out cordons, a drain cordons then evicts), whoever
# asked for them.
_HELD_BY_REGATTA = (Node.State.DRAINING, Node.State.FAILED, Node.State.REPLACED)


def _taken_out_by_regatta(row: Node) -> bool:
    """Whether Regatta itself holds the node out at the provider: a take-out
    or drain, or a cordon the reconciler made on evidence (an operator's
    cordon in Regatta, or the scheduler's hold it follows, is not one)."""
    if row.state in _HELD_BY_REGATTA:
        return True
    if row.state != Node.State.CORDONED or row.state_reason.startswith(HELD):
        return False
    actor = (row.events.filter(to_state=Node.State.CORDONED).order_by("-created_at", "-id")
             .values_list("actor", flat=True).first())
    return actor == "reconciler"


def _claim_cordon(row: Node) -> None:
    """Ask the provider to mark the node's hold as Regatta's (providers that
    tell holds apart by a mark of Regatta's: Kubernetes' claim_cordon)."""
    try:
        provider = get_provider(row.pool.cluster)
        if isinstance(provider, ClaimsCordons):
            provider.claim_cordon(pool_info(row.pool), row.name)
    except Exception as exc:  # noqa: BLE001 - asked again by the next pass
        log.warning("claiming the cordon of %s failed: %s", row.name, exc)


def _ready_again(since, now) -> str:
    return f"ready again after {(now - since).total_seconds():.0f} s: no failure"


def _not_ready(grace_s: float) -> str:
    return f"the provider reports it not ready; it fails if that lasts {grace_s:g} s"


def _follow_readiness(row: Node, seen, grace_s: float, now) -> None:
    if seen.ready:
        if row.not_ready_since is not None:
            Node.objects.filter(pk=row.pk).update(not_ready_since=None)
            if row.state == Node.State.READY:
                row.note(_ready_again(row.not_ready_since, now),
                         now=now, evidence={"provider_status": seen.conditions})
        return
    if row.state != Node.State.READY:
        return
    if row.not_ready_since is None:
        Node.objects.filter(pk=row.pk).update(not_ready_since=now)
        row.not_ready_since = now
        row.note(_not_ready(grace_s), now=now, evidence={"provider_status": seen.conditions})
    lasted = (now - row.not_ready_since).total_seconds()
    if lasted < grace_s:
        return
    _fail(row, seen, lasted, now)


def _fail(row: Node, seen, lasted: float, now) -> None:
    """Not ready past the grace: failed, with the provider's words as the
    health event the jobs on it (or this pass, for an idle node) act on."""
    evidence = {"provider_status": seen.conditions, "not_ready_for_s": round(lasted, 1),
                "since": row.not_ready_since.isoformat()}
    if not row.transition(Node.State.FAILED, reason=f"not ready for {lasted:.0f} s at the "
                          "provider", now=now, evidence=evidence,
                          still_in=(Node.State.READY,)):
        return
    Node.objects.filter(pk=row.pk).update(failure_count=F("failure_count") + 1,
                                          not_ready_since=None)
    summary = ", ".join(f"{k}={v}" for k, v in (seen.conditions or {}).items() if v)
    event = NodeHealthEvent.objects.create(
        node=row, kind=NodeHealthEvent.Kind.LOST, severity=NodeHealthEvent.Severity.CRITICAL,
        message=f"not ready for {lasted:.0f} s: {summary}"[:500], evidence=evidence,
        created_at=now)
    if wake.jobs_on(row.id):
        return  # the jobs act on the open event: stop, take out, relaunch
    take_out(row, f"lost: not ready for {lasted:.0f} s", {"health_event": event.id, **evidence},
             now, replace_reason=f"replaced after not being ready for {lasted:.0f} s")
    NodeHealthEvent.objects.filter(pk=event.pk).update(handled_at=now)


# Taken out for a fault: a node in these is watched for its owner's mend. (A
# cordoned node is an operator's or a check's decision: uncordoned by hand.)
MENDABLE = (Node.State.FAILED, Node.State.REPLACED)


def _follow_mend(row: Node, seen, now) -> None:
    if row.state not in MENDABLE or row.admin_hold:
        return
    available = seen.ready and not seen.unschedulable and not seen.admin_hold
    if not available:
        if not row.provider_held:
            Node.objects.filter(pk=row.pk).update(provider_held=True)
        return
    if not row.provider_held or row.return_requested_at is not None:
        return
    if row.replace_requested_at is not None:
        return  # the provider still owes its replacement: that ask comes first
    request_return(row, actor=SCHEDULER, now=now,
                   reason="available again at the provider (mended and resumed by its owner)")



# The columns of a node's row that `plan` reads: a pass reads these of every
# node, and the whole row only of a node that following changes.
COLUMNS = ("id", "state", "admin_hold", "not_ready_since", "provider_held",
           "return_requested_at", "replace_requested_at")
# What following a node comes to: nothing; one of the steps `follow_many`
# takes for many nodes in a statement (the writes and notes `follow` makes);
# or WHOLE: its row loaded as a model and `follow`ed.
QUIET, WHOLE = "quiet", "whole"
NOT_READY, READY_AGAIN, HELD_DOWN = "not ready", "ready again", "held down"


def plan(row: dict, seen, grace_s: float, now) -> str:
    """What `follow` would do to a node, judged from the COLUMNS of its row
    (a dict): QUIET when it writes nothing, one step `follow_many` takes when
    that is all it writes, else WHOLE (a hold, a failure, a return, or more
    than one step). A fleet's pass mostly finds nodes QUIET, and a spell
    that touches every node at once (an API server's stall leaves them all
    NotReady) is one bulk step. Mirrors `follow`: a change there is one
    here."""
    if (seen.admin_hold or "")[:300] != row["admin_hold"]:
        return WHOLE  # _follow_hold: taken, lifted, or a cordon to claim
    steps = []
    since = row["not_ready_since"]
    if seen.ready:
        if since is not None:
            steps.append(READY_AGAIN)
    elif row["state"] == Node.State.READY:
        if since is None:
            if grace_s <= 0:
                return WHOLE  # fails at once
            steps.append(NOT_READY)
        elif (now - since).total_seconds() >= grace_s:
            return WHOLE  # _fail
    if row["state"] in MENDABLE and not row["admin_hold"]:
        if not (seen.ready and not seen.unschedulable and not seen.admin_hold):
            if not row["provider_held"]:
                steps.append(HELD_DOWN)
        elif (row["provider_held"] and row["return_requested_at"] is None
              and row["replace_requested_at"] is None):
            return WHOLE  # request_return
    if not steps:
        return QUIET
    return steps[0] if len(steps) == 1 else WHOLE


def follow_many(steps: dict[str, list], grace_s: float, now) -> None:
    """Take the steps `plan` gave, each for all its nodes at once: the same
    writes and notes `follow` makes one node at a time, in a few statements
    whatever the fleet's size. `steps` maps a step to its (row, seen) pairs,
    the rows as `plan` read them."""
    at = event_time(now)
    events = []

    def note(row: dict, reason: str, seen) -> None:
        events.append({"node_id": row["id"], "from_state": row["state"],
                       "to_state": row["state"], "reason": reason[:300],
                       "evidence": {"provider_status": seen.conditions}, "created_at": at})

    went = steps.get(NOT_READY, ())
    update_by_ids(Node, [row["id"] for row, _ in went], not_ready_since=now)
    for row, seen in went:
        note(row, _not_ready(grace_s), seen)
    back = steps.get(READY_AGAIN, ())
    update_by_ids(Node, [row["id"] for row, _ in back], not_ready_since=None)
    for row, seen in back:
        if row["state"] == Node.State.READY:
            note(row, _ready_again(row["not_ready_since"], now), seen)
    update_by_ids(Node, [row["id"] for row, _ in steps.get(HELD_DOWN, ())],
                  provider_held=True)
    insert_rows(NodeEvent, events)
