"""A job's metric points, the names it reported and the rollups charts read.

Models of the `jobs` app that belong to this feature; jobs/models.py
imports them so that Django finds them with the app's models."""

from django.db import models


class MetricPoint(models.Model):
    """One value of one metric at one step, from one rank of one attempt.

    The primary key is the only index, and every read goes through it: a
    job's metric by rank and step (the charts, rank 0 speaking for the job),
    the newest step, a step range. Its attempt makes a point unique, so a
    retried batch stores nothing twice (the job is the attempt's: the worker
    token's HMAC covers both, jobs/worker_api/tokens.py). Every point written
    maintains every index and constraint, on the hottest insert of the
    control plane, so there is no surrogate id and no foreign-key
    constraint (each a trigger and a row lock per point): that the attempt
    exists is checked once a statement, under a lock its deletion waits for
    (jobs/metrics/ingest.py, jobs/receivers.py, which deletes an attempt's points).
    """

    pk = models.CompositePrimaryKey("job_id", "name", "rank", "step", "attempt_id")
    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE,
                            related_name="metric_points", db_index=False, db_constraint=False)
    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.DO_NOTHING,
                                related_name="metric_points", db_index=False,
                                db_constraint=False)
    rank = models.PositiveIntegerField(default=0)
    name = models.CharField(max_length=64)
    step = models.PositiveIntegerField()
    value = models.FloatField()
    time = models.DateTimeField()


class MetricName(models.Model):
    """One row per metric a job has reported, kept on ingest: the job's
    metric names without a DISTINCT over its million points."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE,
                            related_name="metric_names", db_index=False)
    name = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="uniq_metric_name")]


class MetricRollup(models.Model):
    """Aggregates of one attempt's points of one metric over a bucket of
    `level` steps (bucket = step // level), kept on ingest from exactly the
    points that were new (jobs/metrics/rollups.py), so a long series is charted from
    a few thousand buckets instead of a million points. `rank0` splits rank
    0's points from the other ranks': a chart shows rank 0's alone when it
    reported the metric."""

    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE,
                                related_name="metric_rollups", db_index=False)
    name = models.CharField(max_length=64)
    rank0 = models.BooleanField()
    level = models.PositiveIntegerField()
    bucket = models.PositiveIntegerField()
    # The first and last step with a point, the extremes, the sum and count
    # (the mean) and the value at the last step.
    s0 = models.PositiveIntegerField()
    s1 = models.PositiveIntegerField()
    vmin = models.FloatField()
    vmax = models.FloatField()
    vsum = models.FloatField()
    n = models.PositiveIntegerField()
    vlast = models.FloatField()

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["attempt", "name", "rank0", "level", "bucket"], name="uniq_metric_rollup")]
