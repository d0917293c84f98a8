"""/metrics: the fleet in Prometheus's text format (docs/monitoring.md).

Computed at scrape time from the database (jobs by phase, queue waits,
admission waits, nodes by state, the goodput ledger, each running job's
newest step, throughput, loss and MFU) and from the counters every process
adds to in Redis (reconcile passes, their durations and errors, metric
points ingested: controlplane/lib/telemetry.py). A scrape costs a handful of
grouped queries, whatever the fleet's size.

Access: with REGATTA_METRICS_TOKEN set, a scraper sends it as a bearer
token; without one, only the addresses in REGATTA_METRICS_ALLOW (loopback by
default) may scrape. Behind a proxy on the same host every caller's peer
address is the proxy's, a loopback one: so with no trusted proxy
(REGATTA_TRUSTED_PROXIES=0) a request that carries a proxy's forwarding
headers is refused, and with N trusted proxies the address the outermost
one saw is checked (controlplane.lib.http.client_address). A proxy that
adds no forwarding header is not told apart: set a token behind it.
"""

from __future__ import annotations

import hmac
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min, OuterRef, Subquery, Sum
from django.http import HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from clusters.models import Node
from controlplane.lib import telemetry
from controlplane.lib.http import came_through_a_proxy, client_address
from jobs.goodput.models import GoodputEntry
from jobs.metrics.models import MetricPoint
from jobs.models import Phase, TrainingJob

# Admissions this recent make the admission-wait quantiles.
ADMISSION_WINDOW = timedelta(minutes=15)


class FleetCollector:
    def __init__(self, now=None):
        self.now = now

    def collect(self):
        now = self.now or timezone.now()
        yield from _jobs(now)
        yield from _admission(now)
        yield from _nodes()
        yield from _goodput()
        yield from _running(now)
        yield from _counters()


def _jobs(now):
    phases = GaugeMetricFamily("regatta_jobs", "Jobs by phase", labels=["cluster", "team", "phase"])
    rows = (TrainingJob.objects.values("cluster__name", "team__name", "phase")
            .annotate(n=Count("id")).order_by())
    for row in rows:
        phases.add_metric([row["cluster__name"], row["team__name"], row["phase"]], row["n"])
    yield phases
    oldest = GaugeMetricFamily("regatta_queue_oldest_wait_seconds",
                               "How long the longest-waiting queued job has waited",
                               labels=["cluster"])
    waits = (TrainingJob.objects.filter(phase=Phase.QUEUED).values("cluster__name")
             .annotate(since=Min("created_at")).order_by())
    for row in waits:
        oldest.add_metric([row["cluster__name"]], (now - row["since"]).total_seconds())
    yield oldest


def _admission(now):
    waits = sorted(
        (admitted - created).total_seconds()
        for created, admitted in TrainingJob.objects.filter(
            admitted_at__gte=now - ADMISSION_WINDOW).values_list("created_at", "admitted_at")
    )
    family = GaugeMetricFamily(
        "regatta_admission_wait_seconds",
        f"Submit to admission, over the jobs admitted in the last "
        f"{int(ADMISSION_WINDOW.total_seconds() // 60)} minutes", labels=["quantile"])
    for q in (0.5, 0.95, 1.0):
        if waits:
            family.add_metric([str(q)], waits[min(len(waits) - 1, int(q * len(waits)))])
    yield family


def _nodes():
    family = GaugeMetricFamily("regatta_nodes", "Nodes by state",
                               labels=["cluster", "pool", "state", "spare"])
    rows = (Node.objects.values("cluster__name", "pool__name", "state", "is_spare")
            .annotate(n=Count("id")).order_by())
    for row in rows:
        family.add_metric([row["cluster__name"], row["pool__name"] or "", row["state"],
                           str(row["is_spare"]).lower()], row["n"])
    yield family


def _goodput():
    seconds = CounterMetricFamily("regatta_goodput_seconds", "The goodput ledger: seconds by cause",
                                  labels=["team", "category"])
    gpu = CounterMetricFamily("regatta_goodput_gpu_seconds",
                              "The goodput ledger: GPU-seconds by cause",
                              labels=["team", "category"])
    rows = (GoodputEntry.objects.values("job__team__name", "category")
            .annotate(s=Sum("seconds"), g=Sum("gpu_seconds")).order_by())
    for row in rows:
        labels = [row["job__team__name"], row["category"]]
        seconds.add_metric(labels, row["s"] or 0.0)
        gpu.add_metric(labels, row["g"] or 0.0)
    yield seconds
    yield gpu


def _newest(name: str):
    # Rank 0's, as a chart shows it: the key (job, name, rank, step) read
    # backwards from its end, one row.
    return Subquery(MetricPoint.objects.filter(job=OuterRef("pk"), name=name, rank=0)
                    .order_by("-step").values("value")[:1])


def _running(now):
    labels = ["job", "name", "team", "cluster"]
    gauges = {
        "step": GaugeMetricFamily("regatta_job_step", "A running job's newest step", labels=labels),
        "tokens_per_s": GaugeMetricFamily("regatta_job_tokens_per_second",
                                          "A running job's throughput", labels=labels),
        "samples_per_s": GaugeMetricFamily("regatta_job_samples_per_second",
                                           "A running job's throughput", labels=labels),
        "loss": GaugeMetricFamily("regatta_job_loss", "A running job's newest loss",
                                  labels=labels),
        "mfu": GaugeMetricFamily("regatta_job_mfu", "A running job's newest model FLOPs "
                                 "utilisation", labels=labels),
    }
    jobs = (TrainingJob.objects.filter(phase=Phase.RUNNING)
            .annotate(loss=_newest("loss"), mfu=_newest("mfu"))
            .values("pk", "name", "team__name", "cluster__name", "current_step", "progress",
                    "loss", "mfu"))
    for job in jobs:
        values = [str(job["pk"]), job["name"], job["team__name"], job["cluster__name"]]
        progress = job["progress"] or {}
        gauges["step"].add_metric(values, job["current_step"])
        for key in ("tokens_per_s", "samples_per_s"):
            if isinstance(progress.get(key), int | float):
                gauges[key].add_metric(values, progress[key])
        for key in ("loss", "mfu"):
            if job[key] is not None:
                gauges[key].add_metric(values, job[key])
    yield from gauges.values()


def _counters():
    series = telemetry.read()
    passes = HistogramMetricFamily("regatta_reconcile_duration_seconds",
                                   "Reconcile passes and how long they took", labels=["kind"])
    for kind in sorted({labels["kind"] for labels, _ in
                        series.get("reconcile_duration_seconds_count", [])}):
        buckets = sorted(
            ((labels["le"], value) for labels, value in
             series.get("reconcile_duration_seconds_bucket", []) if labels["kind"] == kind),
            key=lambda b: float(b[0]))
        total = sum(v for labels, v in series.get("reconcile_duration_seconds_sum", [])
                    if labels["kind"] == kind)
        passes.add_metric([kind], buckets=buckets, sum_value=total)
    yield passes
    errors = CounterMetricFamily("regatta_reconcile_errors", "Reconcile passes that raised",
                                 labels=["kind", "error_class"])
    for labels, value in series.get("reconcile_errors", []):
        errors.add_metric([labels["kind"], labels["error_class"]], value)
    yield errors
    ingested = CounterMetricFamily("regatta_metric_points_ingested",
                                   "Metric points the trainers reported and were stored")
    ingested.add_metric([], sum(v for _, v in series.get("metric_points_ingested", [])))
    yield ingested


def _allowed(request) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    if not settings.TRUSTED_PROXIES and came_through_a_proxy(request):
        return False
    return client_address(request) in settings.METRICS_ALLOW


def metrics_view(request):
    if request.method != "GET":
        return HttpResponse("GET only\n", status=405, content_type="text/plain")
    if not _allowed(request):
        return HttpResponse(
            "forbidden: send REGATTA_METRICS_TOKEN as a bearer token, or scrape from an "
            "address in REGATTA_METRICS_ALLOW\n", status=403, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
