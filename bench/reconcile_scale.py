"""One cluster reconcile pass over 10,000 nodes, then one admission pass
over 2,000 queued jobs, on the in-memory provider (tests/support): seconds
per pass, and admissions per second beside Kueue's published figure (about
43 workloads/s) as a ratio. Then the job side of a sweep: the reconcile of
each of 2,000 jobs that stay queued (it reads the reason admission left),
beside an admission pass per job (what each queued job's reconcile once
ran) as a ratio.

    .venv/bin/python bench/reconcile_scale.py [--nodes 10000] [--jobs 2000]
        [--previous-sample 100]

The previous approach costs one O(queue) pass per job, minutes over the
whole queue: it is timed on the first `--previous-sample` jobs (0: all) and
scaled to the queue. Uses its own state folder (SQLite + embedded Redis)
unless DATABASE_URL / REDIS_URL are set; the database is migrated fresh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

KUEUE_ADMISSIONS_PER_S = 43.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--previous-sample", type=int, default=100)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("REGATTA_STATE_DIR", tempfile.mkdtemp(prefix="regatta-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.utils import timezone

    from controlplane.embedded import start_redis

    redis_proc = start_redis(settings.EMBEDDED_REDIS_SOCKET) if settings.EMBEDDED_REDIS else None
    call_command("migrate", verbosity=0)
    from clusters.models import Cluster, Node, NodePool
    from clusters.providers import pool_info
    from clusters.reconcile import reconcile_cluster_unlocked
    from jobs import admission
    from jobs.models import Phase, Quota, Team, TrainingJob
    from jobs.reconcile import reconcile_job_unlocked
    from tests.support import memory_provider as memory

    memory.register()

    def queue(prefix: str, teams: list, now) -> list[int]:
        TrainingJob.objects.bulk_create([
            # Reconciled once already, at submission: what a sweep finds.
            TrainingJob(name=f"{prefix}{i}", team=teams[i % len(teams)], cluster=cluster,
                        num_nodes=1 + i % 4, gpus_per_node=8, phase=Phase.QUEUED,
                        created_at=now, phase_changed_at=now, observed_generation=1)
            for i in range(args.jobs)
        ], batch_size=500)
        return list(TrainingJob.objects.filter(cluster=cluster, phase=Phase.QUEUED,
                                               name__startswith=prefix)
                    .order_by("id").values_list("id", flat=True))

    try:
        cluster = Cluster.objects.create(name=f"scale-{int(time.time())}", provider="memory",
                                         settings={"preflight": False})
        pool = NodePool.objects.create(cluster=cluster, name="gpu", gpus_per_node=8,
                                       size=args.nodes - 100, spare_count=100)
        memory.MemoryProvider(cluster.name).add_nodes(pool_info(pool), args.nodes)
        t0 = time.perf_counter()
        reconcile_cluster_unlocked(cluster.id, timezone.now())
        first_sync = time.perf_counter() - t0
        assert Node.objects.filter(cluster=cluster).count() == args.nodes

        teams = [Team.objects.create(name=f"t{cluster.id}-{i}") for i in range(args.teams)]
        per_team_gpus = (args.nodes - 100) * 8 // args.teams
        for team in teams:
            Quota.objects.create(team=team, cluster=cluster, gpus=per_team_gpus,
                                 max_running_jobs=args.jobs)
        queue("j", teams, timezone.now())

        t0 = time.perf_counter()
        admission.admit(cluster.id, timezone.now())
        busy_pass = time.perf_counter() - t0
        admitted = TrainingJob.objects.filter(cluster=cluster, phase=Phase.ADMITTED).count()

        t0 = time.perf_counter()
        reconcile_cluster_unlocked(cluster.id, timezone.now())
        steady_pass = time.perf_counter() - t0

        # The job side: a second queue of the same shape that stays queued
        # (every team at its running-jobs limit), so each pass is full work.
        for team in teams:
            running = TrainingJob.objects.filter(team=team, cluster=cluster,
                                                 phase=Phase.ADMITTED).count()
            Quota.objects.filter(team=team, cluster=cluster).update(max_running_jobs=running)
        waiting = queue("w", teams, timezone.now())
        admission.admit(cluster.id, timezone.now())  # the cluster side of the sweep

        # Now: each queued job's reconcile reads the reason admission left.
        t0 = time.perf_counter()
        for job_id in waiting:
            reconcile_job_unlocked(job_id, timezone.now())
        sweep_now = time.perf_counter() - t0
        still = TrainingJob.objects.filter(pk__in=waiting, phase=Phase.QUEUED).count()
        assert still == len(waiting), "the job-side queue must stay queued"

        # Previously: each queued job's reconcile ran the cluster's pass first.
        sample = waiting[: args.previous_sample] if args.previous_sample else waiting
        times = []
        for job_id in sample:
            t1 = time.perf_counter()
            admission.admit(cluster.id, timezone.now())
            reconcile_job_unlocked(job_id, timezone.now())
            times.append(time.perf_counter() - t1)
        sweep_before = statistics.fmean(times) * len(waiting)
    finally:
        if redis_proc is not None:
            redis_proc.terminate()

    rate = admitted / busy_pass
    print(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
    print(f"nodes: {args.nodes}  queued jobs: {args.jobs}")
    print(f"first pass (creates {args.nodes} node rows): {first_sync:.2f} s")
    print(f"admission pass: {busy_pass:.2f} s, {admitted} jobs admitted")
    print(f"steady pass (nothing to do): {steady_pass:.2f} s")
    print(f"admissions/s: {rate:.0f}  vs Kueue ~{KUEUE_ADMISSIONS_PER_S:.0f}/s: "
          f"ratio {rate / KUEUE_ADMISSIONS_PER_S:.1f}x")
    n = len(waiting)
    scaled = "" if len(sample) == n else f" (timed on {len(sample)} jobs, scaled to {n})"
    print(f"job side of a sweep, {n} jobs that stay queued:")
    print(f"  now: {sweep_now:.2f} s ({1000 * sweep_now / n:.2f} ms a job)")
    print(f"  previously, a pass per job: {sweep_before:.1f} s "
          f"({1000 * sweep_before / n:.1f} ms a job){scaled}")
    print(f"  ratio: {sweep_before / sweep_now:.0f}x faster")


if __name__ == "__main__":
    main()
