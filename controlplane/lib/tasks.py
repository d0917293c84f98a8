"""Helpers for Celery tasks: enqueue after commit, ids only."""

from django.db import transaction


def enqueue_on_commit(task, *ids: int) -> None:
    """Send `task` with ids once the surrounding transaction commits, so the
    worker never reads a row before it exists."""
    for value in ids:
        if not isinstance(value, int):
            raise TypeError(f"tasks take ids only, got {type(value).__name__}")
    transaction.on_commit(lambda: task.delay(*ids))
