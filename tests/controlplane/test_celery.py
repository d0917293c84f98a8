"""Celery: tasks take ids only, every beat entry expires, and a real worker
on the real broker runs a task end to end."""

import inspect

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings

from controlplane.celery import app
from controlplane.lib.tasks import enqueue_on_commit
from tests.support.waiting import eventually

OUR_APPS = ("jobs.", "clusters.", "checkpoints.", "accounts.", "controlplane.",
            "notifications.")


def _our_tasks():
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if name.startswith(OUR_APPS)}


def test_there_are_tasks_to_check():
    assert {"jobs.tasks.reconcile_job", "jobs.tasks.sweep_jobs",
            "clusters.tasks.reconcile_cluster"} <= set(_our_tasks())


@pytest.mark.parametrize("name", sorted(_our_tasks()))
def test_every_task_takes_ids_only(name):
    task = _our_tasks()[name]
    for param in inspect.signature(task.run).parameters.values():
        assert param.annotation is int, (
            f"{name}({param.name}) must take an int id, not {param.annotation!r}"
        )
        # Many ids of one kind come as *<thing>_ids (ints all the same).
        suffix = "_ids" if param.kind is inspect.Parameter.VAR_POSITIONAL else "_id"
        assert param.name.endswith(suffix), f"{name}({param.name}): name ids as <thing>{suffix}"


@pytest.mark.parametrize("name", sorted(_our_tasks()))
def test_every_task_acknowledges_late(name):
    assert _our_tasks()[name].acks_late is True


def test_enqueue_refuses_anything_but_ids(db):
    from jobs.tasks import reconcile_job

    with pytest.raises(TypeError, match="tasks take ids only"):
        enqueue_on_commit(reconcile_job, object())


def test_every_beat_entry_expires_and_names_a_real_task():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule
    tasks = _our_tasks()
    for name, entry in schedule.items():
        assert entry["options"]["expires"] > 0, f"beat entry {name} has no expiry"
        assert entry["task"] in tasks, f"beat entry {name} names unknown task {entry['task']}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_real_worker_on_the_real_broker_runs_the_sweep_end_to_end(cluster):
    """beat's sweep → broker → worker → sweep task → reconcile task → database."""
    from clusters.models import Cluster
    from clusters.tasks import sweep_clusters

    assert cluster.last_reconciled_at is None
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        sweep_clusters.delay()
        eventually(lambda: Cluster.objects.get(pk=cluster.pk).last_reconciled_at is not None,
                   timeout=30, interval=0.2, what="the cluster reconciled")
