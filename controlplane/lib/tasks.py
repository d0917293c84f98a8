"""Helpers for Celery tasks: enqueue after commit, through ports, ids only.

Code below the task layer (services, reconcilers, models), and code of
another app, sends a task through a port instead of importing the module
that defines it: a task module imports the reconciler it wraps, so an import
the other way would close a circle, and this kernel names no app at all, not
even by a dotted string. The app that owns a task provides it to its port
when Django starts (its `AppConfig.ready`).
"""

import logging

from django.conf import settings
from django.db import transaction
from kombu.exceptions import OperationalError

from . import locks

log = logging.getLogger(__name__)


class Port:
    """A task that one app provides and any code may send, by port."""

    def __init__(self, what: str):
        self.what = what
        self.task = None

    def provide(self, task) -> None:
        if self.task is not None and self.task is not task:
            raise RuntimeError(f"{self.what}: provided twice ({self.task.name}, {task.name})")
        self.task = task

    def soon(self, *ids: int) -> None:
        """Send the task with `ids` once the surrounding transaction commits:
        "reconcile this job soon" is `RECONCILE_JOB.soon(job_id)`, wherever
        it is asked."""
        enqueue_on_commit(self, *ids)

    def resolve(self):
        if self.task is None:
            raise LookupError(f"no installed app provides the task to {self.what}")
        return self.task

    def __repr__(self) -> str:
        return f"<Port {self.what}>"


# The reconcile and admission tasks, by port: `jobs` provides the first three,
# `clusters` the last (each in its AppConfig.ready).
RECONCILE_JOB = Port("reconcile a job")
RECONCILE_JOBS = Port("reconcile several jobs")
ADMIT_CLUSTER = Port("admit a cluster's queue")
RECONCILE_CLUSTER = Port("reconcile a cluster")


def enqueue_on_commit(task, *ids: int) -> None:
    """Send `task` (a task or its port) with ids once the
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
    # The task object itself, not send_task: a registered task honours
    # CELERY_TASK_ALWAYS_EAGER like a direct .delay() does.
    return task.resolve() if isinstance(task, Port) else task


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
