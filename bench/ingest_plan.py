"""What the metric store's statement costs as it is (new points counted per
batch by a GROUP BY) beside the one before it (the same statement counting
them by joining the inserted points back to the batch's rows), in the same
run, on the plans PostgreSQL picks and on the generic plan.

The join's hazard was a nested loop under a generic plan with stale
statistics: 2.96 s for a 5,000-point batch instead of 0.04 s, 118 s for
30,000, measured where the suite's compare tests had run the statement on
the connection before (tests/jobs/metrics/test_ingest_plan.py reads that
plan with EXPLAIN). This bench measures what the grouped count costs on
every batch where both plans are good.

Creates a throwaway test database on the PostgreSQL that DATABASE_URL names
and analyzes the metric and attempt tables while they are empty. Each
statement is prepared as the web prepares it (controlplane/lib/prepared.py),
run on --warm small batches, then on --repeat batches of each --sizes; the
two statements take turns. The first pass leaves the choice of plan to
PostgreSQL, the second asks for the generic plan every time
(`plan_cache_mode`), the third runs after an ANALYZE with the rows in.
Prints the median milliseconds per batch and the ratio of the statement as
it is to the one before.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/regatta_bench \\
        .venv/bin/python bench/ingest_plan.py [--sizes 10,500,5000] [--repeat 5]
"""

from __future__ import annotations

import argparse
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

# The count as it was before: a join whose method the planner picks from its
# estimates (a nested loop under a generic plan with stale statistics).
JOINED = (
    "), counted AS ("
    " SELECT u.b, count(*) AS n FROM new JOIN u"
    " ON (u.a, u.r, u.n, u.s) = (new.attempt_id, new.rank, new.name, new.step) GROUP BY u.b"
    ") SELECT g.b,"
)


def statements() -> dict[str, str]:
    from jobs.metrics import ingest

    now = ingest._PG_STORE
    start = now.index("), counted AS (")
    end = now.index(") SELECT g.b,") + len(") SELECT g.b,")
    return {"grouped (now)": now, "joined (before)": now[:start] + JOINED + now[end:]}


class Series:
    """One attempt's points, a fresh step range per batch (every point new)."""

    def __init__(self, job_id: int, attempt_id: int):
        self.job_id, self.attempt_id, self.next_step = job_id, attempt_id, 0

    def batch(self, size: int):
        from jobs.metrics import ingest

        rows = [(rank, name, self.next_step + i // 4, 1.0 + i, None)
                for i, (rank, name) in enumerate(
                    [(r, n) for r in (0, 1) for n in ("loss", "lr")] * (size // 4 + 1))][:size]
        self.next_step += size
        return ingest._params([ingest._Batch(self.job_id, self.attempt_id, rows)])


def run(sql: str, params: dict) -> float:
    from controlplane.lib.prepared import prepared_cursor

    start = time.perf_counter()
    with prepared_cursor(connection) as cursor:
        cursor.execute(sql, params)
        cursor.fetchall()
    return time.perf_counter() - start


def measure(label: str, series: dict, sizes: list[int], warm: int, repeat: int) -> None:
    texts = statements()
    for name in texts:  # the small batches after which a generic plan may be kept
        for _ in range(warm):
            run(texts[name], series[name].batch(10))
    times: dict[tuple[str, int], list[float]] = {}
    for size in sizes:
        for _ in range(repeat):
            for name, sql in texts.items():
                times.setdefault((name, size), []).append(run(sql, series[name].batch(size)))
    print(f"\n{label}")
    print(f"{'points in the batch':>20} | {'grouped (now) ms':>17} | "
          f"{'joined (before) ms':>18} | now/before")
    for size in sizes:
        now = statistics.median(times[("grouped (now)", size)]) * 1000
        before = statistics.median(times[("joined (before)", size)]) * 1000
        print(f"{size:>20} | {now:>17.2f} | {before:>18.2f} | {now / before:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,500,5000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warm", type=int, default=6)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if connection.vendor != "postgresql":
        sys.exit("bench/ingest_plan.py measures PostgreSQL's plans: set DATABASE_URL")

    from clusters.models import Cluster, NodePool
    from jobs.models import JobAttempt, Team, TrainingJob

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs_jobattempt, jobs_metricpoint, jobs_metricrollup")
        cluster = Cluster.objects.create(name="bench", provider="local")
        pool = NodePool.objects.create(cluster=cluster, name="p", gpus_per_node=8, size=4)
        team = Team.objects.create(name="bench")

        def fresh_series() -> dict:
            out = {}
            for name in statements():
                job = TrainingJob.objects.create(name=name, team=team, cluster=cluster,
                                                 pool=pool, num_nodes=1, gpus_per_node=8)
                attempt = JobAttempt.objects.create(job=job, number=1, state="running")
                out[name] = Series(job.pk, attempt.pk)
            return out

        series = fresh_series()
        measure("statistics taken while the tables were empty, PostgreSQL's choice of plan",
                series, sizes, args.warm, args.repeat)
        with connection.cursor() as cursor:  # the plan a connection may keep, every time
            cursor.execute("SET plan_cache_mode = force_generic_plan")
        measure("statistics taken while the tables were empty, the generic plan", series,
                sizes, args.warm, args.repeat)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        connection.close()  # a new connection: its statements planned afresh, no SET
        measure("statistics taken with the rows in", fresh_series(), sizes, args.warm,
                args.repeat)
    finally:
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
