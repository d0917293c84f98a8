"""jobs 0007_metric_rollups: points stored before the rollups existed get
their names rows and rollups, equal to what ingest would have kept."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.metrics import ingest
from jobs.metrics.models import MetricName, MetricRollup

BEFORE = [("jobs", "0006_list_page_indexes")]
AFTER = [("jobs", "0007_metric_rollups")]

pytestmark = pytest.mark.django_db(transaction=True)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def rows():
    return sorted(MetricRollup.objects.values_list(
        "attempt_id", "name", "rank0", "level", "bucket", "s0", "s1", "vmin", "vmax", "n",
        "vlast"))


def test_existing_points_are_rolled_up_as_ingest_would_have(cluster, team):
    old = migrate(BEFORE)
    Job, Attempt = old.get_model("jobs", "TrainingJob"), old.get_model("jobs", "JobAttempt")
    Point = old.get_model("jobs", "MetricPoint")
    job = Job.objects.create(name="old", team_id=team.pk, cluster_id=cluster.pk, num_nodes=1,
                             gpus_per_node=2)
    attempt = Attempt.objects.create(job=job, number=1)
    points = [(rank, name, step, (step % 13) * 0.5 - rank)
              for rank in (0, 1) for name in ("loss", "lr") for step in range(1, 700, 3)]
    Point.objects.bulk_create([
        Point(job=job, attempt=attempt, rank=r, name=n, step=s, value=v, time=attempt.created_at)
        for r, n, s, v in points])
    migrate(AFTER)
    migrated = rows()
    assert sorted(MetricName.objects.values_list("name", flat=True)) == ["loss", "lr"]
    # What ingest keeps for the same points, stored afresh (by today's
    # ingest, on today's schema).
    Point.objects.all().delete()
    MetricRollup.objects.all().delete()
    migrate(newest())
    ingest.store(job.pk, attempt.pk, [(r, n, s, v, None) for r, n, s, v in points],
                 received=len(points))
    assert migrated and migrated == rows()


def newest():
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    return executor.loader.graph.leaf_nodes()


@pytest.fixture(autouse=True)
def back_to_the_newest_schema():
    """The tests after this one run on every migration, not on 0005."""
    yield
    migrate(newest())
