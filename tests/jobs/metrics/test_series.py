"""LTTB downsampling and the per-step series read."""

import numpy as np

from jobs.metrics.series import lttb


def test_it_keeps_short_series_whole():
    xs, ys = lttb([1, 2, 3], [3.0, 2.0, 1.0], 600)
    assert xs.tolist() == [1, 2, 3] and ys.tolist() == [3.0, 2.0, 1.0]


def test_it_returns_exactly_n_points_with_both_ends_in_step_order():
    steps = np.arange(10_000)
    values = np.sin(steps / 300.0)
    xs, ys = lttb(steps, values, 600)
    assert len(xs) == 600
    assert xs[0] == 0 and xs[-1] == 9_999
    assert np.all(np.diff(xs) > 0)
    assert np.allclose(ys, np.sin(xs / 300.0))


def test_a_single_spike_survives_downsampling():
    values = np.ones(100_000)
    values[43_210] = 50.0
    xs, ys = lttb(np.arange(100_000), values, 200)
    assert 50.0 in ys.tolist()
    assert 43_210 in xs.tolist()


def test_it_chooses_the_point_that_makes_the_largest_triangle():
    # Two buckets between the ends: in each, the point furthest from the line wins.
    xs, ys = lttb([0, 1, 2, 3, 4, 5], [0.0, 5.0, 0.1, 0.0, -4.0, 0.0], 4)
    assert xs.tolist() == [0, 1, 4, 5]


def test_tiny_targets_keep_the_ends():
    xs, _ = lttb(range(10), range(10), 2)
    assert xs.tolist() == [0, 9]


def _job_with_attempts(team, cluster, resume_steps):
    from django.utils import timezone

    from jobs.models import JobAttempt, TrainingJob

    job = TrainingJob.objects.create(name="s", team=team, cluster=cluster, num_nodes=1,
                                     gpus_per_node=1)
    attempts = [
        JobAttempt.objects.create(job=job, number=i + 1, resume_step=r, state="running")
        for i, r in enumerate(resume_steps)
    ]
    return job, attempts, timezone.now()


def _points(job, attempt, steps, value, now, rank=0):
    # Through the ingest path, as the worker endpoint stores them (the
    # rollups a long series is read from are kept there).
    from jobs.metrics import ingest

    rows = [(rank, "loss", s, value(s), now.timestamp()) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))


def test_after_a_rollback_the_newest_attempt_wins_the_replayed_steps(db, team, cluster):
    from jobs.metrics.series import series

    job, (first, second), now = _job_with_attempts(team, cluster, [None, 30])
    _points(job, first, range(1, 51), lambda s: 1.0, now)  # got to 50, fell back to 30
    _points(job, second, range(31, 61), lambda s: 2.0, now)
    _points(job, second, range(31, 61), lambda s: 9.0, now, rank=1)
    got = dict(series(job.pk, "loss", 1000)["points"])
    assert sorted(got) == list(range(1, 61))
    assert {got[s] for s in range(1, 31)} == {1.0}
    assert {got[s] for s in range(31, 61)} == {2.0}


def test_a_fresh_restart_hides_every_point_of_the_attempts_before_it(db, team, cluster):
    from jobs.metrics.series import series

    job, (first, second, third), now = _job_with_attempts(team, cluster, [None, 20, None])
    _points(job, first, range(1, 31), lambda s: 1.0, now)
    _points(job, second, range(21, 41), lambda s: 2.0, now)
    _points(job, third, range(1, 11), lambda s: 3.0, now)
    got = dict(series(job.pk, "loss", 1000)["points"])
    assert got == {s: 3.0 for s in range(1, 11)}


def test_the_queries_of_a_series_do_not_grow_with_the_attempts(
    db, team, cluster, django_assert_max_num_queries
):
    from jobs.metrics.series import series

    def queries_for(resume_steps):
        job, attempts, now = _job_with_attempts(team, cluster, resume_steps)
        for attempt, start in zip(attempts, [0, *resume_steps[1:]], strict=True):
            _points(job, attempt, range(start + 1, start + 11), float, now)
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            series(job.pk, "loss", 1000)
        return len(ctx.captured_queries)

    assert queries_for([None, 5]) == queries_for([None, *range(5, 305, 5)])


def test_a_long_series_is_bucketed_in_the_database_and_keeps_its_spike(db, team, cluster):
    from jobs.metrics.series import EXACT_LIMIT, series

    job, (attempt,), now = _job_with_attempts(team, cluster, [None])
    total = EXACT_LIMIT * 3
    _points(job, attempt, range(1, total + 1),
            lambda s: 50.0 if s == 33_333 else 1.0 / s, now)
    out = series(job.pk, "loss", 300)
    assert out["total"] == total
    assert len(out["points"]) == 300
    steps = [s for s, _ in out["points"]]
    assert steps == sorted(steps)
    assert max(v for _, v in out["points"]) == 50.0
    assert out["points"][0][1] == 1.0
