"""Admissions/s of one admission pass on a big cluster with sharing off
(queue order, no borrowing) and on (fair share by weight, borrowing), as a
ratio, beside Kueue's published figure (about 43 workloads/s).

    .venv/bin/python bench/admission_sharing.py [--nodes 10000] [--jobs 2000]
        [--teams 20]

Each mode gets its own cluster of `--nodes` nodes (8 GPUs each), `--teams`
teams with equal quotas and weights 1..4, and `--jobs` queued gangs of 4-11
nodes (more than the cluster holds: the pass is contended). Three quarters
of the jobs come from the first half of the teams, so
with sharing on those teams (all may borrow) go past their quotas into the
other half's idle quota. Uses its own state folder (SQLite + embedded Redis)
unless DATABASE_URL / REDIS_URL are set; the database is migrated.
"""

from __future__ import annotations

import argparse
import os
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
    from jobs import admission
    from jobs.models import Phase, Quota, Team, TrainingJob
    from tests.support import memory_provider as memory

    memory.register()  # the clusters' provider kind; no provider call is made

    def run(sharing: bool, nodes: int, jobs: int) -> tuple[float, int, int]:
        stamp = f"{time.time_ns()}-{'on' if sharing else 'off'}"
        cluster = Cluster.objects.create(
            name=f"share-{stamp}", provider="memory",
            settings={"preflight": False, "fair_share": sharing})
        pool = NodePool.objects.create(cluster=cluster, name="gpu", gpus_per_node=8,
                                       size=nodes, spare_count=0)
        # Ready node rows as the cluster reconcile leaves them, written at
        # once: creating 10,000 rows one by one is that reconcile's bench
        # (bench/reconcile_scale.py), not this one's.
        Node.objects.bulk_create([
            Node(cluster=cluster, pool=pool, name=f"n{i}", provider_id=f"mem://n{i}",
                 state=Node.State.READY, gpus=8) for i in range(nodes)], batch_size=1000)
        teams = [Team.objects.create(name=f"s{stamp}-{i}") for i in range(args.teams)]
        per_team = nodes * 8 // args.teams
        for i, team in enumerate(teams):
            Quota.objects.create(team=team, cluster=cluster, gpus=per_team,
                                 max_running_jobs=jobs, priority_weight=1 + i % 4,
                                 can_borrow=sharing)
        half = max(1, args.teams // 2)
        now = timezone.now()
        TrainingJob.objects.bulk_create([
            TrainingJob(name=f"j{i}", cluster=cluster,
                        team=teams[i % half] if i % 4 != 3 else teams[half + i % half],
                        num_nodes=4 + i % 8, gpus_per_node=8, priority=i % 3,
                        phase=Phase.QUEUED, created_at=now, phase_changed_at=now,
                        observed_generation=1)
            for i in range(jobs)
        ], batch_size=500)
        t0 = time.perf_counter()
        if os.environ.get("BENCH_PROFILE") and sharing:
            import cProfile
            import pstats

            with cProfile.Profile() as prof:
                admission.admit(cluster.id, timezone.now())
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        else:
            admission.admit(cluster.id, timezone.now())
        seconds = time.perf_counter() - t0
        admitted = TrainingJob.objects.filter(cluster=cluster, phase=Phase.ADMITTED)
        borrowing = admitted.filter(borrowed_gpus__gt=0).count()
        return seconds, admitted.count(), borrowing

    try:
        run(False, 100, 20)  # warms the connection and the caches; not counted
        off = run(False, args.nodes, args.jobs)
        on = run(True, args.nodes, args.jobs)
    finally:
        if redis_proc is not None:
            redis_proc.terminate()

    print(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
    print(f"nodes: {args.nodes}  queued jobs: {args.jobs}  teams: {args.teams}")
    rates = {}
    for label, (seconds, admitted, borrowing) in (("off", off), ("on", on)):
        rates[label] = admitted / seconds if seconds else float("inf")
        print(f"sharing {label}: pass {seconds:.2f} s, {admitted} admitted "
              f"({borrowing} borrowing), {rates[label]:.0f} admissions/s "
              f"(Kueue ~{KUEUE_ADMISSIONS_PER_S:.0f}/s: "
              f"{rates[label] / KUEUE_ADMISSIONS_PER_S:.1f}x)")
    print(f"ratio on/off: {rates['on'] / rates['off']:.2f}")


if __name__ == "__main__":
    main()
