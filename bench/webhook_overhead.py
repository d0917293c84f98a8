"""What webhooks cost the reconcile path, and what one delivery costs.

Creates a throwaway test database (PostgreSQL when DATABASE_URL is set, else
SQLite in the state folder) and uses the real broker (REDIS_URL, or the
embedded one if it runs). Times:

1. job transitions (running → failed, the event and, with webhooks, the
   deliveries written in the same transaction and the on-commit send):
   without the notifications receiver (baseline), with it and no webhook,
   and with it and 3 subscribed webhooks;
2. deliveries to a real HTTP server on loopback through
   notifications.delivery.deliver (claim, sign, POST, record) beside a bare
   requests.post of the same body to the same server (baseline).

Usage:

    REGATTA_STATE_DIR=/tmp/bench .venv/bin/python bench/webhook_overhead.py [--jobs 300]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models.signals import post_save  # noqa: E402
from django.utils import timezone  # noqa: E402


class Ok(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def world():
    from clusters.models import Cluster, NodePool
    from jobs.models import Team

    cluster = Cluster.objects.create(name="bench", provider="local")
    NodePool.objects.create(cluster=cluster, name="p", gpus_per_node=8, size=4)
    return cluster, Team.objects.create(name="bench")


def transitions(cluster, team, n: int) -> float:
    """Seconds per running → failed transition over n fresh jobs."""
    from jobs.models import Phase, TrainingJob

    jobs = [TrainingJob.objects.create(name=f"j{i}", team=team, cluster=cluster, num_nodes=1,
                                       gpus_per_node=8, phase=Phase.RUNNING) for i in range(n)]
    start = time.perf_counter()
    for job in jobs:
        with transaction.atomic():
            job.transition(Phase.FAILED, reason="Failed", message="bench",
                           evidence={"class": "code", "budget": 0})
    return (time.perf_counter() - start) / n


def deliveries(team, url: str, n: int) -> tuple[float, float]:
    """Seconds per delivery through deliver(), and per bare POST of its body."""
    from notifications import delivery, payloads
    from notifications.models import Webhook

    hook = Webhook.objects.create(team=team, url=url, events=["job.failed"])
    now = timezone.now()
    rows = [delivery.ping(hook, now) for _ in range(n)]
    body = payloads.body(rows[0].payload)
    session_less = time.perf_counter()
    for _ in range(n):
        requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    bare = (time.perf_counter() - session_less) / n
    start = time.perf_counter()
    for row in rows:
        assert delivery.deliver(row.pk, now).status == "succeeded"
    return (time.perf_counter() - start) / n, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    args = parser.parse_args()

    from jobs.models import JobEvent
    from notifications.models import Webhook
    from notifications.receivers import job_event_saved

    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        cluster, team = world()
        transitions(cluster, team, 20)  # warm up
        post_save.disconnect(job_event_saved, sender=JobEvent,
                             dispatch_uid="notifications.job_event")
        base = transitions(cluster, team, args.jobs)
        post_save.connect(job_event_saved, sender=JobEvent,
                          dispatch_uid="notifications.job_event")
        none = transitions(cluster, team, args.jobs)
        for _ in range(3):
            Webhook.objects.create(team=team, url=url, events=["job.failed"])
        three = transitions(cluster, team, args.jobs)
        per_delivery, bare = deliveries(team, url, args.jobs)
        print(f"database: {connection.vendor}, {args.jobs} transitions / deliveries each")
        print(f"{'':<52}{'ms each':>9}{'ratio':>8}")
        print(f"{'transition, no notifications receiver (baseline)':<52}{base * 1e3:>9.2f}"
              f"{1:>8.2f}")
        print(f"{'transition, receiver, team has no webhook':<52}{none * 1e3:>9.2f}"
              f"{none / base:>8.2f}")
        print(f"{'transition, receiver, 3 subscribed webhooks':<52}{three * 1e3:>9.2f}"
              f"{three / base:>8.2f}")
        print(f"{'bare POST of a delivery body (baseline)':<52}{bare * 1e3:>9.2f}{1:>8.2f}")
        print(f"{'deliver(): claim, sign, POST, record':<52}{per_delivery * 1e3:>9.2f}"
              f"{per_delivery / bare:>8.2f}")
    finally:
        server.shutdown()
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
