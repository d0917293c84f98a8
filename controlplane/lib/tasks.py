"""Helpers for Celery tasks: enqueue after commit, by name, ids only.

Code below the task layer (services, reconcilers, models) names the task it
wants run instead of importing the module that defines it: a task module
imports the reconciler it wraps, so an import the other way would close a
circle.
"""

import logging

from celery import current_app
from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from . import locks

log = logging.getLogger(__name__)

# The reconcile and admission tasks, by name (their modules import the code
# that enqueues them).
RECONCILE_JOB = "jobs.tasks.reconcile_job"
RECONCILE_JOBS = "jobs.tasks.reconcile_jobs"
ADMIT_CLUSTER = "jobs.tasks.admit_cluster"
RECONCILE_CLUSTER = "clusters.tasks.reconcile_cluster"


def enqueue_on_commit(task, *ids: int) -> None:
    """Send `task` (a task or its registered name) with ids once the
    surrounding transaction commits, so the worker never reads a row before
    it exists.

    This is the fast path only: the beat sweeps find every row that is due,
    so a broker that cannot be reached (down for a moment, or not started
    yet, as when `make run` creates the demo job before it starts the
    embedded broker) costs a sweep interval, never the committed change."""
    for value in ids:
        if not isinstance(value, int):
            raise TypeError(f"tasks take ids only, got {type(value).__name__}")
    transaction.on_commit(lambda: _send(task, ids))


def _resolve(task):
    # The registry, not send_task: a registered task honours
    # CELERY_TASK_ALWAYS_EAGER like a direct .delay() does.
    return current_app.tasks[task] if isinstance(task, str) else task


def _send(task, ids: tuple[int, ...]) -> None:
    task = _resolve(task)
    try:
        task.delay(*ids)
    except OperationalError as exc:
        log.warning("%s%s not sent (%s); the next sweep picks it up", task.name, ids, exc)


def requeue(task, object_id: int, result, kind: str) -> None:
    """A pass that wants another look sooner than the next sweep gets a
    countdown task; one per object at a time, however many passes asked."""
    if result is None or result.requeue_after is None:
        return
    delay = result.requeue_after
    if delay >= settings.SWEEP_INTERVAL_S:
        return  # the sweep will find it due
    if locks.once_within(f"{kind}:{object_id}", max(delay, 0.05)):
        _resolve(task).apply_async((object_id,), countdown=delay)
