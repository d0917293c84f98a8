"""The admission pass's side of checkpoint-then-preempt: ask the victims to
checkpoint and stop, and note on the waiter who makes room for it. The
victim's own reconcile (jobs/reconcile/preemption.py) waits for the checkpoint and
the exit, then sends it back to the queue."""

from __future__ import annotations

import secrets

from controlplane.lib.tasks import RECONCILE_JOB
from jobs.admission.sharing import EVICTING, NOMINATED, Room
from jobs.models import JobAttempt, TrainingJob


def _with_condition(conditions, kind: str, **fields) -> list:
    rest = [c for c in conditions or [] if c.get("type") != kind]
    return [*rest, {"type": kind, **fields}] if fields else rest


def ask_victims(waiter: TrainingJob, room: Room, team_names: dict, now, wait_s: float) -> None:
    """Each new victim gets the directive on its live attempt (the next
    heartbeat reply carries `stop` and a checkpoint request: the SDK saves,
    then exits 83) and an Evicting condition its reconcile acts on."""
    for holder in room.new:
        victim = TrainingJob.objects.filter(pk=holder.id).first()
        attempt = (JobAttempt.objects.filter(job_id=holder.id).exclude(state__in=JobAttempt.ENDED)
                   .order_by("-number").first())
        if victim is None or attempt is None:
            continue
        request_id = secrets.token_hex(8)
        JobAttempt.objects.filter(pk=attempt.pk).update(
            checkpoint_request_id=request_id, checkpoint_requested_at=now, stop_requested_at=now)
        why = "reclaim" if holder in room.reclaim else "priority"
        # An eval run has nothing to save (it restarts from its parent's
        # checkpoint): stopped at once, the waiter's nodes come free sooner.
        victim_wait_s = 0.0 if holder.is_eval else wait_s
        TrainingJob.objects.filter(pk=victim.pk).update(conditions=_with_condition(
            victim.conditions, EVICTING, by=waiter.id, why=why, attempt=attempt.id,
            request_id=request_id, requested_at=now.timestamp(), wait_s=victim_wait_s,
            by_priority=waiter.priority, by_team=team_names.get(waiter.team_id, "")))
        message = (f"job #{waiter.id} ({waiter.name}) of team {team_names.get(waiter.team_id)} "
                   "reclaims the GPUs this gang borrowed" if why == "reclaim" else
                   f"job #{waiter.id} ({waiter.name}, priority {waiter.priority}) needs its GPUs")
        victim.record("PreemptionRequested", f"{message}: checkpoint now, then stop",
                      attempt=attempt, now=now,
                      evidence={"by": waiter.id, "why": why, "request_id": request_id,
                                "wait_s": victim_wait_s})
        RECONCILE_JOB.soon(victim.id)


def nominate(waiter: TrainingJob, room: Room, reason: str, now) -> None:
    """The waiter's Nominated condition (admission considers it first while
    its room is made) and, when new victims were asked, a MakingRoom event."""
    victims = [v.id for v in room.victims]
    noted = next((c for c in waiter.conditions or [] if c.get("type") == NOMINATED), None)
    if noted is not None and noted.get("victims") == victims:
        return
    waiter.conditions = _with_condition(waiter.conditions, NOMINATED, victims=victims,
                                        at=now.timestamp())
    TrainingJob.objects.filter(pk=waiter.pk).update(conditions=waiter.conditions)
    waiter.record("MakingRoom", reason, now=now,
                  evidence={"victims": [{"job": v.id, "priority": v.priority, "gpus": v.world_size,
                                         "reclaim": v in room.reclaim} for v in room.victims]})


def clear_nomination(job: TrainingJob) -> list:
    return _with_condition(job.conditions, NOMINATED)
