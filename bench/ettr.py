"""ETTR (effective training time ratio: productive time over wall time) of a
run with a node failure injected every N seconds, beside the Young/Daly
prediction from the costs measured in the same run.

    .venv/bin/python bench/ettr.py --duration 1800 --every 600 --kill node --checkpoint auto
    .venv/bin/python bench/ettr.py --duration 1200 --every 120   # rank kills, fixed interval

Regatta runs for real (see bench/recovery.py: runserver, a Celery worker, the
local provider); every `--every` seconds rank 1 is SIGKILLed, or its whole
node (`--kill node`, the node kill fault). Measured:
productive seconds from the goodput ledger over the wall time since the first
step. Predicted (first-order Young/Daly, with MTBF = the injection period M,
checkpoint cost C = median blocking seconds, checkpoint period T = interval
steps × median step time, restart latency R from the ledger):

    ETTR ≈ (1 − C/T) × (1 − (R + L) / M)

where L is the work a failure rolls back: T/2 on average for a relaunch from
the last periodic checkpoint; with the survivors' hand-over (issue 30) the
steps lost per failure measured in the same run, times the step time.
`--checkpoint auto` lets the job choose its interval (Young/Daly, from its
own measured costs); T is then the interval it chose.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recovery import (  # noqa: E402
    TRAINER,
    kill_regatta_node,
    start_control_plane,
    sweep_until,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of wall time")
    parser.add_argument("--every", type=float, default=120.0, help="seconds between failures")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps")
    parser.add_argument("--checkpoint", choices=("steps", "auto"), default="steps",
                        help="the job's checkpoint policy: every --checkpoint-every steps, "
                             "or chosen by the job (Young/Daly)")
    parser.add_argument("--kill", choices=("rank", "node"), default="rank")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="regatta-ettr-"))
    failures = int(args.duration // args.every) + 2
    trainer = {**TRAINER, "log_every_steps": 10, "step_sleep_s": 0.05}
    job, cluster, stop = start_control_plane(workdir, failures, trainer,
                                             checkpoint_every=args.checkpoint_every,
                                             checkpoint_policy=args.checkpoint)
    from checkpoints.models import Checkpoint
    from clusters.providers import get_provider
    from jobs import goodput
    from jobs.models import RankStatus

    provider = get_provider(cluster)
    injected = 0
    try:
        first = sweep_until(lambda: job.attempts.filter(state="running").first(), timeout=300)
        t0 = first.first_step_at.timestamp()
        next_kill = t0 + args.every
        while time.time() < t0 + args.duration:
            if time.time() >= next_kill:
                live = job.attempts.filter(state="running").order_by("-number").first()
                if live is not None:
                    if args.kill == "node":
                        kill_regatta_node(live, provider)
                    else:
                        provider.kill_rank(live.provider_ref, rank=1)
                    injected += 1
                    print(f"  failure {injected} at +{time.time() - t0:.0f} s", flush=True)
                next_kill += args.every
            sweep_until(lambda: True)
            time.sleep(0.5)
        wall = time.time() - t0
        # The ledger keeps the running attempt current as of each pass;
        # bring it up to this instant before reading it.
        from django.utils import timezone

        live = job.attempts.filter(state="running").order_by("-number").first()
        if live is not None:
            goodput.book_running(job, live, timezone.now())
        summary = goodput.summarize(job.goodput.all())["categories"]
        productive = summary["productive"]["seconds"]
        costs = list(Checkpoint.objects.filter(job=job).values_list("blocking_seconds",
                                                                      flat=True))
        step_times = list(RankStatus.objects.filter(attempt__job=job, step_time_s__gt=0)
                          .values_list("step_time_s", flat=True))
        # Failure recoveries only: the first attempt's start-up is booked
        # under the same category but is no part of the Young/Daly R.
        restarts = job.goodput.filter(category="restart", key__startswith="restart-"
                                      ).values_list("seconds", flat=True)
        job.refresh_from_db()
        interval = job.effective_checkpoint_every
        # Steps trained again after each failure: the last step the failed
        # attempt reported against the step its successor resumed from.
        attempts = list(job.attempts.order_by("number"))
        lost = [max(0, prev.last_step - nxt.resume_step)
                for prev, nxt in zip(attempts, attempts[1:], strict=False)
                if nxt.resume_step is not None]
    finally:
        stop()
    c = statistics.median(costs) if costs else 0.0
    step = statistics.median(step_times) if step_times else float("nan")
    t = interval * step
    r = statistics.median(restarts) if restarts else 0.0
    m = args.every
    rollback = statistics.mean(lost) * step if lost else t / 2
    predicted = (1 - c / t) * (1 - (r + rollback) / m)
    measured = productive / wall
    print(f"wall {wall:.0f} s, failures injected {injected} (one every {m:.0f} s, "
          f"{args.kill} kills)")
    print(f"measured: checkpoint cost C={c:.3f} s, period T={t:.2f} s "
          f"({interval} steps × {step:.3f} s, policy {args.checkpoint}), "
          f"restart latency R={r:.1f} s")
    print(f"steps lost per failure: {lost} (rollback L={rollback:.2f} s per failure)")
    print(f"ETTR measured {measured:.3f}  vs Young/Daly prediction {predicted:.3f}  "
          f"(ratio {measured / predicted:.2f})")


if __name__ == "__main__":
    main()
