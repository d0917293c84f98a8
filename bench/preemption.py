"""Preemption latency: seconds from a high-priority job's submission to its
first step when a running gang of its team holds the nodes (the gang is asked
for a checkpoint, stops, requeues), beside the same job's cold start on free
nodes, measured in the same run, round by round (a ratio). Also the victim's
side: how long it took to checkpoint and leave, and the steps it lost.

    .venv/bin/python bench/preemption.py --rounds 3

Regatta runs for real as in bench/recovery.py: its own SQLite and Redis in a
fresh state folder, `manage.py runserver`, a Celery worker, beat's sweeps
every 0.5 s, the local provider; the jobs are the 2-rank nano trainer on a
2-node pool with no spare, so the high-priority job can only start by
preempting the gang.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recovery import TRAINER, start_control_plane, sweep_until  # noqa: E402

HIGH_PRIORITY = 5


def first_step(job, number: int):
    attempt = job.attempts.filter(number=number, first_step_at__isnull=False).first()
    return attempt.first_step_at if attempt else None


def submit(template, name: str, priority: int):
    from jobs import tasks
    from jobs.models import TrainingJob

    job = TrainingJob.objects.create(
        name=name, team=template.team, cluster=template.cluster, num_nodes=2, gpus_per_node=1,
        hyperparameters=template.hyperparameters, checkpoint_every_steps=5, priority=priority)
    tasks.reconcile_job.delay(job.id)
    return job


def cancel(job) -> None:
    from jobs import tasks

    job.request_cancel("bench")
    tasks.reconcile_job.delay(job.id)
    sweep_until(lambda: (job.refresh_from_db() or job.phase) == "cancelled")


def one_round(number: int, low) -> tuple[float, float, dict]:
    # The gang runs past a checkpoint; a high-priority job of its team arrives.
    sweep_until(lambda: low.attempts.filter(state="running", last_step__gte=7).exists())
    attempts = low.attempts.count()
    high = submit(low, f"high-{number}", HIGH_PRIORITY)
    started = sweep_until(lambda: first_step(high, 1))
    preempt_s = (started - high.created_at).total_seconds()
    victim = low.events.filter(kind="Preempted").order_by("-id").first()
    evidence = victim.evidence if victim else {}
    cancel(high)
    # The gang resumes; then it leaves, and the same job starts cold.
    sweep_until(lambda: low.attempts.filter(number=attempts + 1, state="running").exists())
    cancel(low)
    cold = submit(low, f"cold-{number}", HIGH_PRIORITY)
    cold_s = (sweep_until(lambda: first_step(cold, 1)) - cold.created_at).total_seconds()
    cancel(cold)
    return preempt_s, cold_s, evidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="regatta-preemption-"))
    print(f"work folder: {workdir}")
    trainer = {**TRAINER, "step_sleep_s": 0.1}
    low, cluster, stop = start_control_plane(workdir, 5, trainer)
    from clusters.models import NodePool

    NodePool.objects.filter(cluster=cluster).update(spare_count=0)
    cluster.settings = {**cluster.settings, "preemption_checkpoint_wait_s": 60.0}
    cluster.save(update_fields=["settings"])
    preempt, cold, victims = [], [], []
    try:
        for number in range(1, args.rounds + 1):
            p, c, evidence = one_round(number, low)
            preempt.append(p)
            cold.append(c)
            victims.append(evidence)
            print(f"  round {number}: submit to first step {p:.2f} s preempting "
                  f"(victim checkpoint at step {evidence.get('checkpoint_step')}, left after "
                  f"{evidence.get('waited_s', float('nan')):.2f} s, "
                  f"{evidence.get('steps_lost')} steps lost), {c:.2f} s cold", flush=True)
            if number < args.rounds:  # the next round's gang; the last round leaves none
                low = submit(low, f"low-{number + 1}", 0)
    finally:
        stop()
    mp, mc = statistics.median(preempt), statistics.median(cold)
    waits = [v["waited_s"] for v in victims if isinstance(v.get("waited_s"), int | float)]
    print(f"median over {args.rounds} rounds:")
    print(f"  cold start on free nodes:       {mc:.2f} s")
    print(f"  start by preempting the gang:   {mp:.2f} s  (ratio {mp / mc:.2f}x, "
          f"+{mp - mc:.2f} s)")
    if waits:
        print(f"  the victim's checkpoint-and-leave: {statistics.median(waits):.2f} s; "
              f"steps lost: {[v.get('steps_lost') for v in victims]}")


if __name__ == "__main__":
    main()
