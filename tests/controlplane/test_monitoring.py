"""/metrics: Prometheus's own text parser reads every series named in
docs/monitoring.md, with values from the database and from the counters the
reconcile runner and the metrics endpoint add to in Redis; only a holder of
the token, or an allowed address, may scrape."""


import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from clusters.models import Node
from controlplane.lib import runner, telemetry
from controlplane.lib.errors import PermanentError
from controlplane.lib.reconcile import Result
from controlplane.redis_client import get_redis
from jobs.goodput.models import GoodputEntry
from jobs.metrics.models import MetricPoint
from jobs.models import Phase, TrainingJob
from jobs.worker_api.tokens import issue as issue_token
from tests.fleet_helpers import later, launch, memory_cluster, submit, team_with_quota
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture(autouse=True)
def fresh_counters():
    telemetry.flush()  # sums an earlier test's batches left in this process
    get_redis().delete(telemetry.KEY)
    yield
    telemetry.flush()
    get_redis().delete(telemetry.KEY)


def scrape(client=None, **headers) -> dict:
    resp = (client or Client()).get("/metrics", **headers)
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain; version=")
    return {f.name: f for f in text_string_to_metric_families(resp.content.decode())}


def samples(family, name=None) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples
            if name is None or s.name == name}


class Passes:
    """A kind of object for the runner: one pass that succeeds, one that raises."""

    name = "probe"
    keeps_asks = False

    def reconcile(self, object_id, now):
        if object_id == 2:
            raise PermanentError("the bucket is gone")
        return Result.done("ok")

    def errors_in_a_row(self, object_id):
        return 0

    def record_error(self, object_id, now, error):
        pass

    def clear_error(self, object_id):
        pass


def test_the_fleet_jobs_nodes_ledger_and_counters_are_exposed(db):
    cluster = memory_cluster()
    team = team_with_quota(cluster)
    now = timezone.now()
    running = submit(cluster, team, name="gpt")
    launch(running, now)
    TrainingJob.objects.filter(pk=running.pk).update(
        phase=Phase.RUNNING, current_step=120, progress={"tokens_per_s": 5000.0})
    attempt = running.attempts.get()
    for step, loss in ((100, 2.5), (120, 2.25)):
        MetricPoint.objects.create(job=running, attempt=attempt, name="loss", step=step,
                                   value=loss, time=now)
    submit(cluster, team, name="waiting", nodes=4)
    GoodputEntry.objects.create(job=running, attempt=attempt, category="productive",
                                seconds=60.0, gpu_seconds=240.0, key="probe", created_at=now)
    runner.run(Passes(), 1, now)
    runner.run(Passes(), 2, now)
    telemetry.count("metric_points_ingested", 7)

    families = scrape()

    jobs = samples(families["regatta_jobs"])
    assert jobs[(("cluster", "mem-a"), ("phase", "running"), ("team", "vision"))] == 1
    assert jobs[(("cluster", "mem-a"), ("phase", "pending"), ("team", "vision"))] == 1
    nodes = samples(families["regatta_nodes"])
    assert nodes[(("cluster", "mem-a"), ("pool", "gpu"), ("spare", "false"),
                  ("state", "ready"))] == Node.objects.filter(is_spare=False, state="ready").count()
    job = (("cluster", "mem-a"), ("job", str(running.pk)), ("name", "gpt"), ("team", "vision"))
    assert samples(families["regatta_job_step"])[job] == 120
    assert samples(families["regatta_job_loss"])[job] == 2.25  # the newest point
    assert samples(families["regatta_job_tokens_per_second"])[job] == 5000.0
    ledger = samples(families["regatta_goodput_gpu_seconds"], "regatta_goodput_gpu_seconds_total")
    assert ledger[(("category", "productive"), ("team", "vision"))] == 240.0
    duration = families["regatta_reconcile_duration_seconds"]
    counts = samples(duration, "regatta_reconcile_duration_seconds_count")
    assert counts[(("kind", "probe"),)] == 2
    errors = samples(families["regatta_reconcile_errors"], "regatta_reconcile_errors_total")
    assert errors == {(("error_class", "permanent"), ("kind", "probe")): 1.0}
    ingested = samples(families["regatta_metric_points_ingested"],
                       "regatta_metric_points_ingested_total")
    assert ingested == {(): 7.0}


def test_queue_and_admission_waits_are_measured(db):
    cluster = memory_cluster()
    team = team_with_quota(cluster)
    now = timezone.now()
    TrainingJob.objects.create(name="q", team=team, cluster=cluster, num_nodes=1,
                               gpus_per_node=1, phase=Phase.QUEUED,
                               created_at=now - timezone.timedelta(seconds=90))
    TrainingJob.objects.create(name="a", team=team, cluster=cluster, num_nodes=1,
                               gpus_per_node=1, phase=Phase.ADMITTED, admitted_at=now,
                               created_at=now - timezone.timedelta(seconds=4))

    families = scrape()

    oldest = samples(families["regatta_queue_oldest_wait_seconds"])[(("cluster", "mem-a"),)]
    assert 89 < oldest < 200
    admission = samples(families["regatta_admission_wait_seconds"])
    assert 3.9 < admission[(("quantile", "0.5"),)] < 5


def test_only_the_token_or_an_allowed_address_may_scrape(db, settings):
    settings.METRICS_TOKEN = None
    settings.METRICS_ALLOW = ["127.0.0.1"]
    assert Client().get("/metrics").status_code == 200
    refused = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert refused.status_code == 403 and b"REGATTA_METRICS_TOKEN" in refused.content

    settings.METRICS_TOKEN = "s3cret"
    assert Client().get("/metrics").status_code == 403  # loopback alone is not enough now
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    scrape(Client(REMOTE_ADDR="10.1.2.3"), HTTP_AUTHORIZATION="Bearer s3cret")
    assert Client().post("/metrics").status_code in (403, 405)


def test_behind_a_proxy_on_the_same_host_a_caller_is_not_taken_for_a_local_one(db, settings):
    """The proxy connects from loopback for everyone; its forwarding headers
    say so, and without a trusted proxy such a request is refused."""
    settings.METRICS_TOKEN = None
    settings.METRICS_ALLOW = ["127.0.0.1"]
    for header in ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"):
        refused = Client(REMOTE_ADDR="127.0.0.1", **{header: "203.0.113.9"}).get("/metrics")
        assert refused.status_code == 403, header
    # With the proxy trusted, the address it saw is the one checked.
    settings.TRUSTED_PROXIES = 1
    proxied = Client(REMOTE_ADDR="127.0.0.1")
    assert proxied.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    scrape(proxied, HTTP_X_FORWARDED_FOR="spoofed, 127.0.0.1")


def test_a_scrape_still_answers_with_redis_down(db, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    get_redis.cache_clear()  # the process's one client was made for the real Redis
    try:
        families = scrape()
    finally:
        get_redis.cache_clear()
    assert "regatta_jobs" in families
    assert samples(families["regatta_metric_points_ingested"],
                   "regatta_metric_points_ingested_total") == {(): 0.0}


def test_metric_batches_are_counted_as_they_are_stored(db):
    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    launch(job, later(timezone.now(), 0))
    attempt = job.attempts.get()
    token = issue_token(attempt)
    body = {"batch_id": "b1", "points": [{"rank": 0, "name": "loss", "step": s, "value": 1.0}
                                         for s in (1, 2, 3)]}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/worker/attempts/{attempt.pk}/metrics"
    assert client.post(url, body, content_type="application/json").status_code in (200, 201)
    assert client.post(url, body, content_type="application/json").status_code in (200, 201)

    ingested = samples(scrape()["regatta_metric_points_ingested"],
                       "regatta_metric_points_ingested_total")
    assert ingested == {(): 3.0}  # the retried batch stored nothing new


def test_the_grafana_dashboard_reads_only_series_that_exist(db):
    """Every metric a panel of deploy/monitoring/regatta-dashboard.json
    queries is one /metrics exposes (a renamed series breaks no panel
    silently)."""
    import json
    import re
    from pathlib import Path

    cluster = memory_cluster()
    job = submit(cluster, team_with_quota(cluster))
    launch(job, timezone.now())
    runner.run(Passes(), 2, timezone.now())
    exposed = {s.name for f in scrape().values() for s in f.samples} | set(scrape())
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
                            / "regatta-dashboard.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bregatta_[a-z_]+", target["expr"])}
    assert len(queried) >= 10
    assert queried <= exposed, queried - exposed


def test_a_batch_count_reaches_redis_within_the_second_without_a_scrape(db):
    """count_soon sums a process's adds and sends them from a timer, so a
    process that takes one batch and no more still reports it."""
    for amount in (5, 6):
        telemetry.count_soon("metric_points_ingested", amount)
    field = telemetry._field("metric_points_ingested", {})
    eventually(lambda: float(get_redis().hget(telemetry.KEY, field) or 0) == 11.0,
               timeout=10, interval=0.05, what="the sums sent")
