"""jobs 0003_budgets: a job mid-run keeps what it had spent (until then every
restart counted against its budget); an ended one starts clean."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("jobs", "0002_user_programs")]
AFTER = [("jobs", "0003_budgets")]

pytestmark = pytest.mark.django_db(transaction=True)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_a_live_job_keeps_its_spent_restarts_through_the_migration(cluster, team):
    old = migrate(BEFORE)
    Job = old.get_model("jobs", "TrainingJob")
    common = {"team_id": team.pk, "cluster_id": cluster.pk, "num_nodes": 1, "gpus_per_node": 2}
    running = Job.objects.create(name="running", phase="running",
                                 restart_counts={"hardware": 3}, **common)
    failed = Job.objects.create(name="failed", phase="failed",
                                restart_counts={"hardware": 6}, **common)
    new = migrate(AFTER)
    Job = new.get_model("jobs", "TrainingJob")
    running, failed = Job.objects.get(pk=running.pk), Job.objects.get(pk=failed.pk)
    assert running.budget_spent == {"hardware": 3}
    assert failed.budget_spent == {}
    assert (running.budget_reset_steps, running.budget_reset_minutes) == (1000, 60)


@pytest.fixture(autouse=True)
def back_to_the_newest_schema():
    """The tests after this one run on every migration, not on 0003."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
