"""How fast a job page's charts load when the job has a million metric points.

Creates a throwaway test database (PostgreSQL when DATABASE_URL is set, else
SQLite in the state folder), stores N loss points for one job through the
ingest path (jobs.metrics.ingest, which keeps the rollups), optionally with other
jobs' points beside it so the table is larger than the job, then times:

- the downsampled series (jobs.metrics.series: LTTB to 600 points) as it is read
  now, from the rollups, beside the raw-aggregate path that every request
  took before (the database buckets all of the job's raw rows);
- the job page's live fragment (`/jobs/<id>/live/`, what the page polls);
- the metric names (one row per job and name);
- fetching every raw point, as a chart without downsampling would.

Each is the median of --repeat runs. Usage:

    DATABASE_URL=postgres://... REGATTA_STATE_DIR=/tmp/bench \
        .venv/bin/python bench/chart_series.py [--points 1000000] [--other-points 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

BATCH = 5_000


def build(points: int, other_points: int):
    from clusters.models import Cluster, NodePool
    from jobs.metrics import ingest
    from jobs.models import JobAttempt, Team, TrainingJob

    cluster = Cluster.objects.create(name="bench", provider="local")
    pool = NodePool.objects.create(cluster=cluster, name="p", gpus_per_node=8, size=4)
    team = Team.objects.create(name="bench")

    def job_with(name: str, count: int):
        job = TrainingJob.objects.create(name=name, team=team, cluster=cluster, pool=pool,
                                         num_nodes=4, gpus_per_node=8)
        attempt = JobAttempt.objects.create(job=job, number=1, state="running")
        for lo in range(0, count, BATCH):
            rows = [(0, "loss", s, 4.0 / (1 + s / 5000) + (s % 97) * 1e-4, None)
                    for s in range(lo, min(count, lo + BATCH))]
            ingest.store(job.pk, attempt.pk, rows, received=len(rows))
        return job

    start = time.perf_counter()
    if other_points:
        job_with("others", other_points)
    job = job_with("million", points)
    print(f"stored {points + other_points:,} points through jobs.metrics.ingest in "
          f"{time.perf_counter() - start:.1f}s")
    return job


def timed(fn, repeat: int) -> tuple[float, object]:
    runs, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--other-points", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from frontend import charts
    from jobs.metrics import series
    from jobs.metrics.models import MetricPoint

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        job = build(args.points, args.other_points)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("ANALYZE")

        def raw():
            rows = list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                        .values_list("step", "value"))
            return json.dumps({"points": rows})

        def from_rollups():
            return json.dumps(series.series(job.pk, "loss", charts.POINTS))

        def raw_aggregate():
            # What every request did before the rollups: bucket all raw rows.
            steps, values, total = series._raw_series(series.plan(job.pk, "loss"),
                                                      charts.POINTS)
            xs, ys = series.lttb(steps, values, charts.POINTS)
            return json.dumps({"total": total, "points": list(zip(xs.tolist(), ys.tolist(),
                                                                  strict=True))})

        from django.contrib.auth import get_user_model
        from django.test import Client

        browser = Client()
        browser.force_login(get_user_model().objects.create_user("bench", is_staff=True))

        def get(path):
            def fetch():
                resp = browser.get(path)
                assert resp.status_code == 200, resp.status_code
                return resp.content
            return fetch

        t_roll, body_roll = timed(from_rollups, args.repeat)
        t_agg, _ = timed(raw_aggregate, args.repeat)
        t_live, _ = timed(get(f"/jobs/{job.pk}/live/"), args.repeat)
        t_names, _ = timed(get(f"/api/v1/jobs/{job.pk}/metrics/names/"), args.repeat)
        t_raw, body_raw = timed(raw, max(1, args.repeat // 2))
        with CaptureQueriesContext(connection) as ctx:
            get(f"/jobs/{job.pk}/live/")()
        print(f"database: {connection.vendor}, job points: {args.points:,}, other jobs' "
              f"points: {args.other_points:,}, median of {args.repeat}")
        print(f"{'fetch':<44}{'ms':>9}{'vs old':>9}")
        print(f"{'series, raw aggregate (old path, baseline)':<44}{t_agg * 1000:>9.1f}{1:>9.2f}")
        print(f"{'series from rollups (LTTB 600)':<44}{t_roll * 1000:>9.1f}"
              f"{t_roll / t_agg:>9.3f}")
        print(f"{'job page /live/ fragment':<44}{t_live * 1000:>9.1f}"
              f"   ({len(ctx.captured_queries)} queries)")
        print(f"{'metric names':<44}{t_names * 1000:>9.1f}")
        print(f"{'all raw points':<44}{t_raw * 1000:>9.1f}{t_raw / t_agg:>9.2f}")
        print(f"series payload {len(body_roll):,} bytes vs {len(body_raw):,} raw")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
