"""The metric store's one statement (jobs/metrics/ingest.py) keeps a plan
linear in the batch's points whatever PostgreSQL's estimates say.

psycopg prepares the statement, and after five runs on a connection
PostgreSQL may keep a generic plan, made without the arrays' lengths. With
statistics taken while the attempts table was empty (as autovacuum does on
a new database, or on the suite's, whose tests roll back), that plan once
joined the inserted points back to the batch's rows in a nested loop: every
new point against every row, 3 s for a 5,000-point batch after five small
ones, 118 s for 30,000. The plan is read with EXPLAIN, not timed.
"""

import re

import pytest
from django.conf import settings
from django.db import connection

from jobs.metrics import ingest
from tests.api_factories import make_attempt, make_job

pytestmark = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="prepared statements and their plans are the PostgreSQL path")


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def test_a_generic_plan_on_stale_statistics_never_pairs_every_point_with_every_row(
        team, cluster, owner):
    job = make_job(team, cluster, owner, name="long")
    attempt = make_attempt(job)[0]
    batch = ingest._Batch(job.pk, attempt.pk, [(0, "loss", s, 1.0, None) for s in range(5000)])
    # The statement's parameters by position, as psycopg numbers them.
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", ingest._PG_STORE)))
    params = ingest._params([batch])
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_metricpoint, jobs_metricrollup")  # rolled back
        cursor.execute("ANALYZE jobs_jobattempt, jobs_metricpoint, jobs_metricrollup")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        text = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m.group(1)) + 1}",
                      ingest._PG_STORE)
        cursor.execute(f"PREPARE regatta_store_plan AS {text}")
        try:
            cursor.execute("EXPLAIN (FORMAT JSON) EXECUTE regatta_store_plan("
                           + ", ".join(["%s"] * len(order)) + ")",
                           [params[name] for name in order])
            plan = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE regatta_store_plan")
    plan = plan[0]["Plan"] if isinstance(plan, list) else plan
    quadratic = [n for n in nodes(plan) if n["Node Type"] == "Nested Loop"
                 and all(c["Node Type"] == "CTE Scan" for c in n.get("Plans", ()))]
    assert quadratic == [], quadratic
