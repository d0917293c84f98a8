"""What one live poll of the job page costs for a long-lived job, beside a
new job's poll in the same run.

The job page polls `/jobs/<id>/live/` every 2.5 s while it is open: the
status, attempts, checkpoints, timeline, goodput and chart series; a poll
that finds nothing new since the last (its revision and charts key sent
back) renders only the status line. A job that
ran for months has thousands of checkpoints, hundreds of attempts and a long
timeline; its poll should cost what a new job's does. Creates a throwaway
test database (PostgreSQL when DATABASE_URL is set, else SQLite in the state
folder), builds both jobs, and prints seconds, bytes and queries per poll
for each, and the long job's over the new job's as a ratio. Usage:

    REGATTA_STATE_DIR=/tmp/bench .venv/bin/python bench/job_page_poll.py \\
        [--checkpoints 10000] [--attempts 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

POINTS_PER_ATTEMPT = 50
EVENTS_PER_ATTEMPT = 6


def build(name: str, checkpoints: int, attempts: int, team, cluster, pool):
    from checkpoints.models import Checkpoint
    from jobs.metrics.models import MetricPoint
    from jobs.models import JobAttempt, JobEvent, TrainingJob

    now = timezone.now()
    job = TrainingJob.objects.create(name=name, team=team, cluster=cluster, pool=pool,
                                     num_nodes=2, gpus_per_node=8, phase="running",
                                     hyperparameters={"max_steps": 10 * checkpoints + 10})
    rows = []
    for n in range(1, attempts + 1):
        # Each attempt resumed a little behind where the one before it got to.
        start = (n - 1) * POINTS_PER_ATTEMPT
        rows.append(JobAttempt(job=job, number=n, resume_step=start or None,
                               state="running" if n == attempts else "failed",
                               created_at=now - timedelta(minutes=attempts - n)))
    made = JobAttempt.objects.bulk_create(rows)
    MetricPoint.objects.bulk_create([
        MetricPoint(job=job, attempt=a, rank=0, name=metric, step=s, value=1.0 / (1 + s),
                    time=now)
        for i, a in enumerate(made)
        for s in range(i * POINTS_PER_ATTEMPT + 1, (i + 1) * POINTS_PER_ATTEMPT + 10)
        for metric in ("loss", "tokens_per_s")
    ], batch_size=5000)
    JobEvent.objects.bulk_create([
        JobEvent(job=job, attempt=a, kind="Launched", message=f"attempt {a.number}",
                 created_at=now - timedelta(seconds=len(made) * EVENTS_PER_ATTEMPT - k))
        for a in made for k in range(EVENTS_PER_ATTEMPT)
    ], batch_size=5000)
    Checkpoint.objects.bulk_create([
        Checkpoint(job=job, attempt=made[-1], step=10 * (i + 1), uri=f"file:///c/step-{i}",
                   bytes=10 << 20, state="verified" if i % 3 else "deleted",
                   created_at=now - timedelta(seconds=checkpoints - i))
        for i in range(checkpoints)
    ], batch_size=5000)
    return job


def poll(browser, job, repeat: int, query: str = "") -> tuple[float, int, int]:
    url = f"/jobs/{job.pk}/live/{query}"
    times, size, queries = [], 0, 0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            resp = browser.get(url)
            times.append(time.perf_counter() - start)
        assert resp.status_code == 200, resp.status_code
        size, queries = len(resp.content), len(ctx.captured_queries)
    return statistics.median(times), size, queries


def since(browser, job) -> str:
    """The query an open page sends once it has drawn everything: the
    revision of its tables and the key of its charts (frontend/static/live.js,
    job.js)."""
    first = browser.get(f"/jobs/{job.pk}/live/").json()
    return f"?rev={first['rev']}&charts_key={first['charts_key']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        from django.contrib.auth import get_user_model
        from django.test import Client

        from clusters.models import Cluster, NodePool
        from jobs.models import Team

        cluster = Cluster.objects.create(name="bench", provider="local")
        pool = NodePool.objects.create(cluster=cluster, name="p", gpus_per_node=8, size=4)
        team = Team.objects.create(name="bench")
        start = time.perf_counter()
        new = build("new", 1, 1, team, cluster, pool)
        long_lived = build("long", args.checkpoints, args.attempts, team, cluster, pool)
        print(f"built the jobs in {time.perf_counter() - start:.1f}s")
        browser = Client()
        browser.force_login(get_user_model().objects.create_user("bench", is_staff=True))
        print(f"database: {connection.vendor}, median of {args.repeat} polls of /jobs/<id>/live/")
        print(f"{'poll':<62}{'seconds':>9}{'bytes':>10}{'queries':>9}")
        label = f"{args.attempts} attempts, {args.checkpoints:,} checkpoints"
        for what, query in (("tables only (?charts=0)", "?charts=0"),
                            ("tables and charts", ""),
                            ("nothing new since the last poll", None)):
            base = poll(browser, new, args.repeat,
                        since(browser, new) if query is None else query)
            ours = poll(browser, long_lived, args.repeat,
                        since(browser, long_lived) if query is None else query)
            print(f"{'new job, ' + what + ' (baseline)':<62}"
                  f"{base[0]:>9.3f}{base[1]:>10,}{base[2]:>9}")
            print(f"{'long job (' + label + '), ' + what:<62}"
                  f"{ours[0]:>9.3f}{ours[1]:>10,}{ours[2]:>9}")
            print(f"  long / new: {ours[0] / base[0]:.2f}x the time, "
                  f"{ours[1] / base[1]:.2f}x the bytes, {ours[2] - base[2]:+d} queries")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
