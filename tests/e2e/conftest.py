"""End-to-end fixtures: the live server (trainers report to it over real
HTTP), a real Celery worker on the real broker, beat's sweeps sent in a
loop, and a local fleet whose ranks are real torchrun processes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from django.db import connection
from regatta.node import standby

from clusters.models import Cluster, NodePool
from clusters.providers import get_provider, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Quota, Team, TrainingJob
from tests.support.waiting import eventually

TRAINER = {
    "model": "nano", "batch_size": 2, "warmup_steps": 2, "log_every_steps": 5,
    "heartbeat_interval_s": 0.5, "async_checkpoint": False, "startup_timeout_s": 120.0,
    "collective_timeout_s": 30.0,
}


class Sweeper:
    """Beat's sweeps of jobs, clusters and admission, sent every `interval`
    seconds through the broker."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        from clusters.tasks import sweep_clusters
        from jobs.tasks import sweep_admission, sweep_jobs

        while not self.stopped.wait(self.interval):
            sweep_jobs.delay()
            sweep_clusters.delay()
            sweep_admission.delay()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=5)


class Fleet:
    def __init__(self, root: Path, live_url: str):
        self.root = root
        self.live_url = live_url

    def cluster(self, name="e2e", size=2, spares=1, **settings) -> Cluster:
        cluster = Cluster.objects.create(
            name=name, provider=Cluster.Provider.LOCAL,
            settings={"fleet_dir": str(self.root / "fleet"), "preflight": False,
                      "observe_interval_s": 0.5, "queue_interval_s": 1.0,
                      "reconcile_interval_s": 1.0, "heartbeat_deadline_s": 30.0,
                      "first_heartbeat_deadline_s": 120.0, "stop_grace_s": 5.0, **settings},
        )
        NodePool.objects.create(cluster=cluster, name="cpu", gpus_per_node=1, size=size,
                                spare_count=spares)
        reconcile_cluster_unlocked(cluster.id)
        self.warm(cluster)
        return cluster

    def warm(self, cluster):
        """Warm standbys on every ready node and wait for them, as `./run`
        warms its idle fleet before the first job (regatta_up's
        `_warm_fleet`): the first launch forks its agent and ranks from
        them, as every relaunch does, instead of importing torch twice per
        node and a standby after. The cold launch has tests of its own
        (tests/clusters/providers/local/test_standby.py)."""
        if standby.unavailable():
            return  # every launch goes cold here
        provider = get_provider(cluster)
        nodes = []
        for pool in cluster.pools.all():
            names = [n.name for n in pool.nodes.filter(state="ready").order_by("name")]
            provider.hold_spares(pool_info(pool), names)
            nodes += names
        self.wait("the fleet's standbys ready", lambda: all(
            standby.state(provider.root, n) == "ready" for n in nodes))

    def submit(self, cluster, name="train", nodes=2, team="vision", gpus=8, **trainer):
        team_row, created = Team.objects.get_or_create(name=team)
        if created:
            Quota.objects.create(team=team_row, cluster=cluster, gpus=gpus)
        job = TrainingJob.objects.create(
            name=name, team=team_row, cluster=cluster, num_nodes=nodes, gpus_per_node=1,
            hyperparameters={**TRAINER, **trainer}, checkpoint_every_steps=5, keep_last=3,
        )
        from jobs import tasks

        tasks.reconcile_job.delay(job.id)
        return job

    def provider(self, cluster):
        return get_provider(cluster)

    def wait(self, what: str, predicate, timeout: float = 120.0, job=None):
        """`eventually`, telling the job's story when it fails."""
        try:
            return eventually(predicate, timeout=timeout, interval=0.2, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.story(job)}") from None

    def story(self, job) -> str:
        if job is None:
            return ""
        job.refresh_from_db()
        lines = [f"job {job.id} phase={job.phase} reason={job.pending_reason!r} "
                 f"error={job.last_error[:300]!r}"]
        for e in job.events.all():
            lines.append(f"  {e.created_at:%H:%M:%S.%f} {e.kind}: {e.message[:160]}")
        for a in job.attempts.all():
            lines.append(f"  attempt {a.number} {a.state} {a.failure_class} {a.provider_ref}")
            for log in Path(a.provider_ref.get("dir", "/nonexistent")).glob("node-*/stdout.log"):
                lines.append(f"    {log}: ..." + log.read_text()[-1500:])
        return "\n".join(lines)

    def stop_everything(self):
        for attempt in JobAttempt.objects.exclude(provider_ref={}):
            try:
                get_provider(attempt.job.cluster).stop(attempt.provider_ref, grace_s=1.0)
            except Exception:  # best effort: a leftover rank must not outlive the test
                pass
        for cluster in Cluster.objects.filter(provider=Cluster.Provider.LOCAL):
            get_provider(cluster).stop_standbys()


@pytest.fixture
def fleet_env(live_server, settings, tmp_path):
    settings.PUBLIC_URL = live_server.url
    settings.CHECKPOINT_ROOT = tmp_path / "checkpoints"
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    settings.LOCAL_FLEET_DIR = tmp_path / "fleet"
    settings.SWEEP_INTERVAL_S = 1.0
    fleet = Fleet(tmp_path, live_server.url)
    yield fleet
    fleet.stop_everything()


def _wake():
    """A timer tick: the worker's event loop runs its pending acks."""


@pytest.fixture
def fleet(fleet_env):
    """The fleet with an in-process Celery worker (threads) and the sweeps."""
    from celery.contrib.testing.worker import start_worker

    import clusters.tasks  # noqa: F401  (registers the tasks with the app)
    import jobs.tasks  # noqa: F401
    from controlplane.celery import app

    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False,
                      shutdown_timeout=30.0, loglevel="WARNING") as worker:
        # A thread pool acks through the worker's event loop (hub.call_soon),
        # and nothing wakes that loop when a task ends: with its prefetch
        # full it sleeps until its next timer, up to 10 s, so a queue with a
        # backlog drains at a few tasks per 10 s and never catches up with
        # the sweeps. Production workers run the prefork pool, whose result
        # pipes wake the loop; a short timer does it here.
        worker.hub.call_repeatedly(0.05, _wake)
        with Sweeper():
            yield fleet_env
    connection.close()


def subprocess_env(fleet: Fleet, **extra) -> dict:
    """The environment a worker subprocess needs to share this test's database,
    broker, storage and live server."""
    from django.conf import settings

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{db['NAME']}"
    else:
        url = (f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/"
               f"{db['NAME']}")
    env = {
        **os.environ, "DATABASE_URL": url, "REGATTA_PUBLIC_URL": fleet.live_url,
        "REGATTA_CHECKPOINT_ROOT": str(settings.CHECKPOINT_ROOT),
        "REGATTA_ARTIFACT_ROOT": str(settings.ARTIFACT_ROOT),
        "REGATTA_LOCAL_FLEET_DIR": str(settings.LOCAL_FLEET_DIR),
        "REGATTA_SWEEP_INTERVAL_S": "1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env
