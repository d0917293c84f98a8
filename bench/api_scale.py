"""List endpoints and the fleet page at scale, each beside the code path it
replaced, in the same run (issue 17, items 3 and 4).

Builds, in a PostgreSQL database of its own (dropped and made again; default
`regatta_bench_scale` on the server of DATABASE_URL), 100k jobs over 21
teams and two clusters, 500k events, 10M metric points, and one long-lived
job with thousands of attempts, checkpoints and events; rows are made by
`INSERT … SELECT … generate_series` from one template row per table, so the
full size builds in minutes. Then it times each endpoint over `--requests`
requests from `--threads` threads (a Django test client each, in process:
middleware, auth, views, serializers, templates; no HTTP server) and prints
p50 and p99 beside its baseline:

- lists: the new page (cursor, no count) beside the old one (limit/offset
  with a COUNT(*) on every page, filters as joins), mounted here under
  /bench-old/ from the same view classes with the old settings;
- teams and quotas: beside their serializers asking usage per quota;
- the fleet page at 1,000 and 10,000 nodes: a page of tiles beside the same
  page rendering every tile (the old page).

With --explain it prints PostgreSQL's plan for each new list query. Sizes
are flags, for a quick run:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x .venv/bin/python bench/api_scale.py \\
        --jobs 20000 --events 100000 --points 1000000 --requests 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

PHASES = ["succeeded", "succeeded", "failed", "cancelled", "running", "queued", "pending"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="regatta_bench_scale")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--teams", type=int, default=21)
    p.add_argument("--events", type=int, default=500_000)
    p.add_argument("--points", type=int, default=10_000_000)
    p.add_argument("--long-attempts", type=int, default=2_000)
    p.add_argument("--long-checkpoints", type=int, default=10_000)
    p.add_argument("--long-events", type=int, default=50_000)
    p.add_argument("--nodes", default="1000,10000", help="fleet sizes, ascending")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--deep", type=int, default=50_000, help="the deep page's offset")
    p.add_argument("--explain", action="store_true")
    p.add_argument("--only", default="", help="comma-separated labels' prefixes to time")
    return p.parse_args()


def use_own_database(name: str) -> None:
    """Point DATABASE_URL at a fresh database `name` on the same server."""
    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("DATABASE_URL must name a PostgreSQL server (the bench needs one)")
    parts = urlsplit(url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))


# --- building the data ----------------------------------------------------

def clone(table: str, template, count: int, **override: str) -> None:
    """`count` copies of one row, each column taken from the template `t`
    unless overridden by an SQL expression over the series number `g`. The
    template is a row's id, or its key as a dict where the table has no id."""
    from django.db import connection

    key = template if isinstance(template, dict) else {"id": template}
    with connection.cursor() as cur:
        columns = [c.name for c in connection.introspection.get_table_description(cur, table)
                   if c.name != "id"]
        values = ", ".join(override.get(c, f"t.{c}") for c in columns).replace("%", "%%")
        where = " AND ".join(f"t.{column} = %s" for column in key)
        cur.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {values} "
                    f"FROM {table} t, generate_series(1, %s) g WHERE {where}",
                    [count, *key.values()])


def pick(ids) -> str:
    ids = list(ids)
    return f"(ARRAY[{','.join(str(int(i)) for i in ids)}])[1 + g % {len(ids)}]"


def build_people_and_fleet(teams: int):
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken
    from clusters.models import Cluster, NodePool
    from jobs.models import Quota, Team

    users = get_user_model().objects
    operator = users.create_user("opal", is_staff=True)
    member = users.create_user("mia")
    clusters = [Cluster.objects.create(name=f"c{i}", provider="local") for i in range(2)]
    pools = [NodePool.objects.create(cluster=c, name="h100", gpus_per_node=8, size=0)
             for c in clusters]
    team_rows = []
    for i in range(teams):
        team = Team.objects.create(name=f"t{i:02d}", display_name=f"Team {i}")
        for cluster in clusters:
            Quota.objects.create(team=team, cluster=cluster, gpus=64, max_running_jobs=50)
        team_rows.append(team)
    team_rows[0].members.add(member)
    tokens = {who.username: ApiToken.issue(who, "bench")[1] for who in (operator, member)}
    return operator, member, tokens, clusters, pools, team_rows


def build_jobs(n: int, teams, clusters, pools):
    from jobs.models import TrainingJob

    long_job = TrainingJob.objects.create(name="long", team=teams[0], cluster=clusters[0],
                                          pool=pools[0], num_nodes=2, gpus_per_node=8,
                                          phase="running", hyperparameters={"max_steps": 10**7})
    phases = "ARRAY[" + ",".join(f"'{p}'" for p in PHASES) + "]"
    clone("jobs_trainingjob", long_job.pk, n - 1,
          name="'job-' || g", team_id=pick(t.pk for t in teams),
          cluster_id=pick(c.pk for c in clusters), pool_id=pick(p.pk for p in pools),
          phase=f"({phases})[1 + (g / {len(teams)}) % {len(PHASES)}]",  # every team, every phase
          created_at="t.created_at - g * interval '7 seconds'")
    return long_job


def build_job_rows(long_job, args):
    """The long job's attempts, checkpoints and events; the other events
    spread over every job; metric points over the long job's attempts."""
    from django.db import connection

    from checkpoints.models import Checkpoint
    from jobs.metrics.models import MetricPoint
    from jobs.models import JobAttempt, JobEvent

    first = JobAttempt.objects.create(job=long_job, number=1, state="failed")
    clone("jobs_jobattempt", first.pk, args.long_attempts - 1, number="g + 1",
          created_at="t.created_at + g * interval '1 minute'")
    checkpoint = Checkpoint.objects.create(job=long_job, attempt=first, step=100, uri="/c/100")
    clone("checkpoints_checkpoint", checkpoint.pk, args.long_checkpoints - 1,
          step="100 + 100 * g", uri="'/c/' || (100 + 100 * g)",
          created_at="t.created_at + g * interval '1 second'")
    event = JobEvent.objects.create(job=long_job, attempt=first, kind="Launched", message="x")
    clone("jobs_jobevent", event.pk, args.long_events - 1,
          created_at="t.created_at + (g % 997) * interval '1 second'")  # ties on the time
    with connection.cursor() as cur:
        cur.execute("SELECT min(id), max(id) FROM jobs_trainingjob")
        lo, hi = cur.fetchone()
        cur.execute("SELECT min(id), max(id) FROM jobs_jobattempt")
        alo, ahi = cur.fetchone()
    clone("jobs_jobevent", event.pk, max(0, args.events - args.long_events),
          job_id=f"{lo} + g % {hi - lo + 1}", attempt_id="NULL",
          created_at="t.created_at - (g % 86400) * interval '1 second'")
    MetricPoint.objects.create(job=long_job, attempt=first, rank=0, name="loss", step=0,
                               value=1.0, time=first.created_at)
    attempts = ahi - alo + 1
    clone("jobs_metricpoint", {"job_id": long_job.pk, "name": "loss", "rank": 0, "step": 0,
                               "attempt_id": first.pk}, args.points - 1,
          attempt_id=f"{alo} + g % {attempts}", step=f"g / {attempts} + 1",
          value="1.0 / (1 + g)")


def build_nodes(cluster, pool, start: int, count: int, team, busy_every: int = 2):
    """`count` nodes; every `busy_every`-th runs a gang of 8, 1 in 50 is
    cordoned, 1 in 97 has an open critical health event."""
    from django.db import connection

    from clusters.models import Node, NodeHealthEvent
    from jobs.models import AttemptNode, JobAttempt, TrainingJob

    node = Node.objects.create(cluster=cluster, pool=pool, name=f"n{start:06d}", gpus=8,
                               state="ready")
    clone("clusters_node", node.pk, count - 1, name=f"'n' || lpad(({start} + g)::text, 6, '0')",
          state="CASE WHEN g % 50 = 0 THEN 'cordoned' ELSE 'ready' END",
          state_reason="CASE WHEN g % 50 = 0 THEN 'XID 79' ELSE '' END",
          is_spare="g % 40 = 1")
    nodes = list(Node.objects.filter(cluster=cluster, name__gte=f"n{start:06d}",
                                     state="ready", is_spare=False).values_list("pk", flat=True))
    gangs = [nodes[i:i + 8] for i in range(0, len(nodes) // busy_every, 8)]
    job = TrainingJob.objects.filter(cluster=cluster, phase="running").first()
    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(max(number), 0) FROM jobs_jobattempt WHERE job_id = %s",
                    [job.pk])
        number = cur.fetchone()[0]
    attempts = JobAttempt.objects.bulk_create(
        [JobAttempt(job=job, number=number + i + 1, state="running") for i in range(len(gangs))])
    AttemptNode.objects.bulk_create([
        AttemptNode(attempt=a, node_id=n, node_rank=r)
        for a, gang in zip(attempts, gangs, strict=True) for r, n in enumerate(gang)])
    NodeHealthEvent.objects.bulk_create([
        NodeHealthEvent(node_id=n, kind="xid", severity="critical", message="XID 48")
        for n in nodes[::97]])


# --- the old code paths, for the baselines ----------------------------------

def old_urls():
    """The list views as they were: limit/offset with a count on every page,
    filters joining the team and cluster by name, usage asked per quota."""
    import django_filters
    from django.urls import include, path
    from rest_framework import generics

    from controlplane.lib.pagination import BoundedLimitOffsetPagination
    from jobs.views import checkpoints, job_list, job_timeline, quotas, teams

    class OldJobFilter(job_list.JobFilter):
        team = django_filters.CharFilter(field_name="team__name")
        cluster = django_filters.CharFilter(field_name="cluster__name")

    def old(view, **attrs):
        return type(f"Old{view.__name__}", (view,), {
            "pagination_class": BoundedLimitOffsetPagination, **attrs}).as_view()

    per_quota = {"get_serializer": generics.GenericAPIView.get_serializer}
    module = types.ModuleType("bench_old_urls")
    module.urlpatterns = [
        path("bench-old/jobs/", old(job_list.JobListView, filterset_class=OldJobFilter)),
        path("bench-old/jobs/<int:pk>/events/", old(job_timeline.JobEventsView)),
        path("bench-old/jobs/<int:pk>/attempts/", old(job_timeline.JobAttemptsView)),
        path("bench-old/jobs/<int:pk>/checkpoints/", old(checkpoints.JobCheckpointListView)),
        path("bench-old/teams/", old(teams.TeamListView, **per_quota)),
        path("bench-old/quotas/", old(quotas.QuotaListView, **per_quota)),
        path("", include("controlplane.urls")),
    ]
    sys.modules[module.__name__] = module
    return module.__name__


# --- timing ---------------------------------------------------------------

class Clients(threading.local):
    """One test client per thread, logged in as the operator."""

    def __init__(self, user, token):
        from django.test import Client

        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        self.client.force_login(user)


def time_url(clients, url: str, requests: int, threads: int) -> list[float]:
    from django.db import connection

    def one(_):
        start = time.perf_counter()
        resp = clients.client.get(url)
        took = time.perf_counter() - start
        assert resp.status_code == 200, (url, resp.status_code, resp.content[:300])
        return took

    def batch(n):
        try:
            return [one(i) for i in range(n)]
        finally:
            connection.close()

    share = [requests // threads + (i < requests % threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(batch, [2] * threads))  # warm each thread's client and connection
        return sorted(sum(pool.map(batch, share), []))


def shape(clients, url: str, repeat: int = 5) -> tuple[int, int, float]:
    """Queries, bytes, and the median milliseconds spent in the database per
    request (one request at a time, from this thread)."""
    from django.db import connection

    spent, queries = [], []

    def clock(execute, sql, params, many, context):
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent[-1] += time.perf_counter() - start
            queries[-1] += 1

    with connection.execute_wrapper(clock):
        for _ in range(repeat):
            spent.append(0.0)
            queries.append(0)
            resp = clients.client.get(url)
    return queries[-1], len(resp.content), statistics.median(spent) * 1000


def pct(times: list[float], q: float) -> float:
    return times[min(len(times) - 1, int(q * len(times)))] * 1000


def explain(clients, url: str, table: str) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        clients.client.get(url)
    page = [q["sql"] for q in ctx.captured_queries
            if f'FROM "{table}"' in q["sql"] and "LIMIT" in q["sql"]]
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + page[-1])
        plan = [row[0] for row in cur.fetchall()]
    print(f"    EXPLAIN {url}:")
    for line in plan:
        if any(w in line for w in ("Scan", "Sort", "Limit", "InitPlan", "Execution", "Join",
                                   "Loop")):
            print(f"      {line.strip()}")


class Report:
    def __init__(self, clients, args):
        self.clients, self.args = clients, args
        print(f"{'endpoint':<44}{'p50 ms':>8}{'p99 ms':>8}{'SQL ms':>8}{'q':>4}{'KB':>5}"
              f"{'| base p50':>10}{'p99':>8}{'SQL ms':>8}{'q':>4}"
              f"{'| p50 ratio':>11}{'SQL ratio':>10}")

    def pair(self, label: str, url: str, base: str) -> None:
        if self.args.only and not label.startswith(tuple(self.args.only.split(","))):
            return
        a, c = self.args.requests, self.args.threads
        new, old = time_url(self.clients, url, a, c), time_url(self.clients, base, a, c)
        self.line(label, new, shape(self.clients, url), old, shape(self.clients, base))

    @staticmethod
    def line(label, new, new_shape, old, old_shape, note=""):
        (nq, nb, ns), (oq, _, os_) = new_shape, old_shape
        print(f"{label:<44}{pct(new, .5):>8.1f}{pct(new, .99):>8.1f}{ns:>8.1f}{nq:>4}"
              f"{nb / 1024:>5.0f}{'| ':>4}{pct(old, .5):>6.1f}{pct(old, .99):>8.1f}{os_:>8.1f}"
              f"{oq:>4}{'| ':>4}{pct(old, .5) / pct(new, .5):>6.1f}x"
              f"{os_ / max(ns, 1e-3):>9.1f}x{note}", flush=True)


def cursor_at(url: str, model, offset: int, ordering: list[str], **filters) -> str:
    """The `next` cursor of the page that ends just before row `offset`."""
    from controlplane.lib.keyset import _encode, _plain

    row = model.objects.filter(**filters).order_by(*ordering)[offset - 1]
    key = [_plain(getattr(row, f.lstrip("-"))) for f in ordering]
    return f"{url}?cursor={_encode(key, False)}"


def lists(report, long_job, teams):
    from jobs.models import JobEvent, TrainingJob

    jobs, events = "/api/v1/jobs/", f"/api/v1/jobs/{long_job.pk}/events/"
    old = "/bench-old"
    report.pair("jobs list", jobs, f"{old}/jobs/")
    for query in (f"?team={teams[3].name}", "?phase=running", "?cluster=c1",
                  f"?team={teams[3].name}&phase=failed&cluster=c1"):
        report.pair(f"jobs {query}", jobs + query, f"{old}/jobs/{query}")
    deep = min(report.args.deep, report.args.jobs // 2)
    report.pair(f"jobs deep page, cursor at {deep:,}",
                cursor_at(jobs, TrainingJob, deep, ["-created_at", "-id"]),
                f"{old}/jobs/?offset={deep}")
    report.pair(f"jobs ?offset={deep:,} (bounded, no count)", f"{jobs}?offset={deep}",
                f"{old}/jobs/?offset={deep}")
    for what in ("events", "attempts", "checkpoints"):
        report.pair(f"long job's {what}", f"/api/v1/jobs/{long_job.pk}/{what}/",
                    f"{old}/jobs/{long_job.pk}/{what}/")
    half = report.args.long_events // 2
    report.pair(f"long job's events, cursor at {half:,}",
                cursor_at(events, JobEvent, half, ["created_at", "id"], job=long_job),
                f"{old}/jobs/{long_job.pk}/events/?offset={half}")
    report.pair("teams", "/api/v1/teams/", f"{old}/teams/")
    report.pair("quotas", "/api/v1/quotas/", f"{old}/quotas/")


def fleet(report, nodes: int):
    from frontend import fleet as page

    label = f"fleet page, {nodes:,} nodes"
    if report.args.only and not label.startswith(tuple(report.args.only.split(","))):
        return
    a, c = report.args.requests, report.args.threads
    new = time_url(report.clients, "/fleet/", a, c)
    new_shape = shape(report.clients, "/fleet/")
    per_page = page.TILES_PER_PAGE
    page.TILES_PER_PAGE = 10**9  # every tile on one page: the old page
    try:
        old = time_url(report.clients, "/fleet/", max(20, a // 5), c)
        old_shape = shape(report.clients, "/fleet/", repeat=3)
    finally:
        page.TILES_PER_PAGE = per_page
    alone, cpu = one_client(report.clients, "/fleet/", 20)
    report.line(label, new, new_shape, old, old_shape,
                f"  (every tile: {old_shape[1] / 1024:.0f} KB; one client: "
                f"p50 {alone:.0f} ms, {cpu:.0f} ms of CPU)")


def one_client(clients, url: str, repeat: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of a request with nothing else in
    flight (CPU: this thread's, i.e. the web process's share, which the load
    of a shared machine does not inflate)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.thread_time()
        clients.client.get(url)
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return statistics.median(wall) * 1000, statistics.median(cpu) * 1000


def main() -> None:
    args = parse_args()
    use_own_database(args.db)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.urls import clear_url_caches

    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    operator, _, tokens, clusters, pools, teams = build_people_and_fleet(args.teams)
    long_job = build_jobs(args.jobs, teams, clusters, pools)
    build_job_rows(long_job, args)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    print(f"built {args.jobs:,} jobs, {args.events:,} events, {args.points:,} metric points "
          f"in {time.perf_counter() - start:.0f}s on {connection.vendor} ({args.db})")
    settings.ROOT_URLCONF = old_urls()
    clear_url_caches()
    clients = Clients(operator, tokens["opal"])
    print(f"p50/p99 over {args.requests} requests from {args.threads} threads, as an operator")
    report = Report(clients, args)
    lists(report, long_job, teams)
    built = 0
    for size in sorted(int(s) for s in args.nodes.split(",") if s):
        build_nodes(clusters[1], pools[1], built, size - built, teams[1])
        built = size
        with connection.cursor() as cur:
            cur.execute("ANALYZE")
        fleet(report, size)
    if args.explain:
        print("plans of the new pages (PostgreSQL, the data above):")
        for url in ("/api/v1/jobs/", f"/api/v1/jobs/?team={teams[3].name}",
                    "/api/v1/jobs/?phase=running", "/api/v1/jobs/?cluster=c1",
                    cursor_at("/api/v1/jobs/", type(long_job), min(args.deep, args.jobs // 2),
                              ["-created_at", "-id"])):
            explain(clients, url, "jobs_trainingjob")
        explain(clients, f"/api/v1/jobs/{long_job.pk}/events/", "jobs_jobevent")
        explain(clients, f"/api/v1/jobs/{long_job.pk}/checkpoints/", "checkpoints_checkpoint")
        explain(clients, f"/api/v1/jobs/{long_job.pk}/attempts/", "jobs_jobattempt")


if __name__ == "__main__":
    main()
