"""The spare invariants under real concurrency: cluster passes, a job's
passes and faults on threads of their own, each with its own database
connection (PostgreSQL row locks when DATABASE_URL points there, SQLite's
IMMEDIATE transactions otherwise), while a watcher reads the pool over and
over. Each read is one statement, so it sees one committed instant: a pool
over its size, or a promotion naming no node, at any instant fails it."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from clusters.models import Node, NodeEvent
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
)

from .spare_invariants import PROMOTED, WORKING, PoolWatch

SIZE = 4


class Race:
    """The threads' bodies over one pool and one job; what went wrong."""

    def __init__(self, cluster, job):
        self.cluster, self.job = cluster, job
        self.pool = cluster.pools.get()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.seen: list[int] = []

    def loop(self, name, body) -> threading.Thread:
        def run():
            try:
                while not self.stop.is_set():
                    body()
            except Exception as exc:  # surfaced by the test
                self.errors.append(f"{name}: {exc!r}")
            finally:
                connection.close()
        return threading.Thread(target=run, name=name)

    def live(self):
        return self.job.attempts.filter(ended_at__isnull=True).order_by("-number").first()

    def cluster_pass(self):
        reconcile_cluster_unlocked(self.cluster.id, timezone.now())

    def job_pass(self):
        attempt = self.live()
        if attempt is not None and attempt.provider_ref:
            heartbeat(attempt, 1, timezone.now())
        reconcile_job_unlocked(self.job.id, timezone.now())

    def watch(self):
        working = Node.objects.filter(pool=self.pool, is_spare=False,
                                      state__in=WORKING).count()
        unnamed = NodeEvent.objects.filter(node__pool=self.pool, reason=PROMOTED).count()
        self.seen.append(working)
        if working > SIZE or unnamed:
            self.errors.append(f"watcher: {working} working, {unnamed} promotions naming "
                               "no node")

    def victim(self, lost: set[str]):
        """A live attempt and one of its nodes not lost yet. On a slow machine
        the passes may not have replaced the last loss 0.3 s later, so this
        waits for one (bounded) rather than losing the same node twice."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            attempt = self.live()
            if attempt is not None and attempt.provider_ref:
                fresh = [n for n in nodes_of(attempt) if n.name not in lost]
                if fresh:
                    return attempt, fresh[0]
            time.sleep(0.05)
        raise AssertionError(f"no live attempt with a node besides {sorted(lost)} in 30 s")

    def until_replaced(self, lost: set[str]) -> None:
        """Until the passes have replaced every lost node (bounded: the test's
        last check then says which were not)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Node.objects.filter(
                pool=self.pool, name__in=lost, state=Node.State.REPLACED).count() < len(lost):
            time.sleep(0.05)

    def faults(self):
        """Two nodes of the job lost, then a spot notice on an idle spare. The
        sleeps pace the faults among the passes."""
        try:
            lost: set[str] = set()
            for _ in range(2):
                time.sleep(0.3)
                attempt, node = self.victim(lost)
                lose_node(self.cluster, node, attempt.provider_ref)
                lost.add(node.name)
            time.sleep(0.3)
            spare = Node.objects.filter(pool=self.pool, is_spare=True, state="ready").first()
            if spare is not None:
                provider_of(self.cluster).signal(
                    pool_info(self.pool), spare.name, "spot_notice", severity="warning",
                    evidence={"action": "terminate",
                              "time": (timezone.now() + timedelta(seconds=120)).timestamp()})
            self.until_replaced(lost)
            time.sleep(1.0)  # the passes race on over the settled pool
        except Exception as exc:  # surfaced by the test
            self.errors.append(f"faults: {exc!r}")
        finally:
            connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_passes_and_faults_on_threads_never_break_the_spare_invariants(fleet_dirs):
    cluster = memory_cluster(size=SIZE, spares=3)
    job = submit(cluster, team_with_quota(cluster),
                 hyperparameters={"model": "nano", "max_steps": 100_000})
    launch(job, timezone.now())
    race = Race(cluster, job)
    threads = [race.loop("cluster", race.cluster_pass), race.loop("job", race.job_pass),
               race.loop("watch", race.watch)]
    for t in threads:
        t.start()
    fault = threading.Thread(target=race.faults, name="faults")
    fault.start()
    fault.join(timeout=90)
    race.stop.set()
    for t in threads:
        t.join(timeout=60)

    assert race.errors == []
    assert race.seen and max(race.seen) <= SIZE
    PoolWatch(race.pool).check("the race")  # every promotion names a working node, once
    replaced = set(Node.objects.filter(pool=race.pool, state=Node.State.REPLACED)
                   .values_list("name", flat=True))
    assert len(replaced) >= 2, replaced
