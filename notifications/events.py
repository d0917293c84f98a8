"""What a team can be told about, and which timeline events say it.

Every event a webhook can subscribe to is read off the job's timeline (a
JobEvent), so notifications need nothing from the reconcilers but the events
they already write: `types_for` is the one place that maps one to the other.
"""

from django.db import models

from jobs.models import JobEvent, Phase


class EventType(models.TextChoices):
    JOB_SUCCEEDED = "job.succeeded", "A job succeeded"
    JOB_FAILED = "job.failed", "A job failed"
    # The gang lost its nodes to preemption: a job of higher priority, a
    # lender reclaiming its quota, a spot notice or a drain.
    JOB_PREEMPTED = "job.preempted", "A job was preempted"
    # A failure spent the job's restart budget for its class: the job failed
    # for it (also sent as job.failed).
    JOB_BUDGET_SPENT = "job.budget_spent", "A job's restart budget was spent"
    NODE_REPLACED = "node.replaced", "A node under a job was replaced"
    # Sent only on request (the API's ping), whatever the subscription.
    PING = "webhook.ping", "A test ping"


SUBSCRIBABLE = [t.value for t in EventType if t != EventType.PING]


def types_for(event: JobEvent) -> list[str]:
    """The notification types a timeline event stands for (usually none)."""
    types = []
    changed = event.from_phase != event.to_phase
    if changed and event.to_phase == Phase.SUCCEEDED:
        types.append(EventType.JOB_SUCCEEDED)
    if changed and event.to_phase == Phase.FAILED:
        types.append(EventType.JOB_FAILED)
        if _budget_spent(event):
            types.append(EventType.JOB_BUDGET_SPENT)
    if _preempted(event):
        types.append(EventType.JOB_PREEMPTED)
    if event.kind == "NodeReplaced":
        types.append(EventType.NODE_REPLACED)
    return [str(t) for t in types]


def _budget_spent(event: JobEvent) -> bool:
    # jobs/recovery/handle.py `_fail` names the class's budget in the
    # evidence. A budget of 0 (a code error fails fast) had no restarts to
    # spend: that is a plain failure.
    budget = (event.evidence or {}).get("budget")
    return isinstance(budget, int) and budget > 0


def _preempted(event: JobEvent) -> bool:
    # "Preempted": evicted for another gang (jobs/reconcile/preemption.py);
    # "Restarting" of class preempted: a spot notice or drain took the nodes
    # (jobs/recovery/handle.py).
    if event.kind == "Preempted":
        return True
    return (event.kind == "Restarting"
            and (event.evidence or {}).get("class") == "preempted")
