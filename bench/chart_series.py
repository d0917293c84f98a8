"""How fast a job page's charts load when the job has a million metric points.

Creates a throwaway test database (PostgreSQL when DATABASE_URL is set, else
SQLite in the state folder), writes N loss points for one job, then times:

- the downsampled series the charts use (jobs.series: LTTB to 600 points),
- the whole chart payload of the job page (loss, val_loss, throughput, marks),
- fetching every raw point, as a chart without downsampling would,
- the job page's HTML itself (the series follow in its first live fetch),

and prints each beside the raw fetch as a ratio. Usage:

    REGATTA_STATE_DIR=/tmp/bench .venv/bin/python bench/chart_series.py [--points 1000000]
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
from django.utils import timezone  # noqa: E402

BATCH = 10_000


def build(points: int):
    from clusters.models import Cluster, NodePool
    from jobs.models import JobAttempt, MetricPoint, Team, TrainingJob

    cluster = Cluster.objects.create(name="bench", provider="local")
    pool = NodePool.objects.create(cluster=cluster, name="p", gpus_per_node=8, size=4)
    team = Team.objects.create(name="bench")
    job = TrainingJob.objects.create(name="million", team=team, cluster=cluster, pool=pool,
                                     num_nodes=4, gpus_per_node=8)
    attempt = JobAttempt.objects.create(job=job, number=1, state="running")
    now = timezone.now()
    start = time.perf_counter()
    for lo in range(0, points, BATCH):
        MetricPoint.objects.bulk_create([
            MetricPoint(job=job, attempt=attempt, rank=0, name="loss", step=s,
                        value=4.0 / (1 + s / 5000) + (s % 97) * 1e-4, time=now)
            for s in range(lo, min(points, lo + BATCH))
        ])
    print(f"wrote {points:,} points in {time.perf_counter() - start:.1f}s")
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
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from frontend import charts
    from jobs import series
    from jobs.models import MetricPoint

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        job = build(args.points)

        def raw():
            rows = list(MetricPoint.objects.filter(job=job, name="loss").order_by("step")
                        .values_list("step", "value"))
            return json.dumps({"points": rows})

        def downsampled():
            return json.dumps(series.series(job.pk, "loss", charts.POINTS))

        def page():
            return json.dumps(charts.chart_data(job))

        from django.contrib.auth import get_user_model
        from django.test import Client

        browser = Client()
        browser.force_login(get_user_model().objects.create_user("bench", is_staff=True))

        def html():
            resp = browser.get(f"/jobs/{job.pk}/")
            assert resp.status_code == 200, resp.status_code
            return resp.content

        t_raw, body_raw = timed(raw, args.repeat)
        t_down, body_down = timed(downsampled, args.repeat)
        t_page, _ = timed(page, args.repeat)
        t_html, body_html = timed(html, args.repeat)
        vendor = connection.vendor
        print(f"database: {vendor}, points: {args.points:,}, median of {args.repeat}")
        print(f"{'fetch':<34}{'seconds':>9}{'bytes':>13}{'vs raw':>9}")
        print(f"{'all raw points (baseline)':<34}{t_raw:>9.3f}{len(body_raw):>13,}{1:>9.2f}")
        print(f"{'downsampled loss (LTTB 600)':<34}{t_down:>9.3f}{len(body_down):>13,}"
              f"{t_down / t_raw:>9.2f}")
        print(f"{'job page chart payload':<34}{t_page:>9.3f}{'':>13}{t_page / t_raw:>9.2f}")
        print(f"{'job page HTML':<34}{t_html:>9.3f}{len(body_html):>13,}{t_html / t_raw:>9.2f}")
        print(f"payload shrinks {len(body_raw) / len(body_down):,.0f}x; "
              f"downsampled fetch takes {t_down / t_raw:.2f} of the raw fetch's time")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
