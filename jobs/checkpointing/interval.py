"""The "auto" checkpoint interval (Young/Daly).

interval_s ≈ sqrt(2 × cost_s × mtbf_s / rollback_share), converted to steps
with the job's measured step time.

- cost_s: the median blocking seconds of the job's checkpoints (the time a
  save stalls training; save seconds where blocking was not measured).
  Before the first checkpoint: DEFAULT_COST_S.
- mtbf_s: the cluster's measured seconds between failures per node — the
  ready node-seconds summed over its nodes, over the node failures seen —
  divided by the job's node count (any of its nodes failing stops the gang).
  A prior of one failure per PRIOR_NODE_MTBF_S ready seconds is added to the
  observations, so a young fleet with no failures yet gets a finite,
  conservative figure that the measurements take over as they accumulate.
- rollback_share: the share of the job's failures that roll it back to a
  checkpoint. When a peer dies, the survivors of a DDP gang hand over the
  last step they completed (docs/trainer.md), so such a failure loses at
  most one step whatever the interval: the checkpoints insure only against
  the rest (a whole gang lost, a hang, FSDP shards gone with their node).
  Young/Daly's trade is then against a rollback every mtbf_s / share
  seconds. Measured from the job's own restarts after failures (a resume
  at most one step behind the last reported step is a hand-over), with a
  prior of one rollback and, where the job can hand over (the built-in
  trainer under DDP), one hand-over; a program of the team's own starts at
  every failure rolling back until its restarts show otherwise.
- step_time_s: the median step time the ranks report in heartbeats; without
  one the interval cannot be turned into steps and the job's fixed
  `checkpoint_every_steps` stays in force.
"""

from __future__ import annotations

import itertools
import math
import statistics

from django.db.models import Sum

from checkpoints.models import Checkpoint
from clusters.models import Node
from jobs.models import FailureClass, JobAttempt, RankStatus, TrainingJob

DEFAULT_COST_S = 10.0
PRIOR_NODE_MTBF_S = 30 * 24 * 3600.0  # one failure per node-month
PRIOR_FAILURES = 1.0


def young_daly_seconds(cost_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * max(cost_s, 1e-6) * max(mtbf_s, 1e-6))


def node_mtbf_s(cluster_id: int) -> float:
    agg = Node.objects.filter(cluster_id=cluster_id).aggregate(
        ready=Sum("ready_seconds"), failures=Sum("failure_count")
    )
    ready = (agg["ready"] or 0.0) + PRIOR_NODE_MTBF_S * PRIOR_FAILURES
    failures = (agg["failures"] or 0) + PRIOR_FAILURES
    return ready / failures


def checkpoint_cost_s(job) -> float:
    rows = Checkpoint.objects.filter(job=job, state__in=Checkpoint.LOADABLE).values_list(
        "blocking_seconds", "save_seconds"
    )[:50]
    costs = [b if b > 0 else s for b, s in rows if (b > 0 or s > 0)]
    return statistics.median(costs) if costs else DEFAULT_COST_S


# The failures a restart resumes from: not a code error (no restart), not a
# preemption (its emergency checkpoint is taken on purpose).
_RESUMED_FAILURES = (FailureClass.HARDWARE, FailureClass.PROCESS, FailureClass.TRANSIENT,
                     FailureClass.HANG)


def rollback_share(job) -> float:
    can_hand_over = not job.entrypoint and job.strategy == TrainingJob.Strategy.DDP
    rolled, handed = 1.0, 1.0 if can_hand_over else 0.0
    attempts = list(JobAttempt.objects.filter(job=job).order_by("number").values_list(
        "failure_class", "last_step", "resume_step"))
    for (failure, last_step, _), (_, _, resumed) in itertools.pairwise(attempts):
        if failure not in _RESUMED_FAILURES:
            continue
        if (last_step or 0) - (resumed or 0) <= 1:
            handed += 1
        else:
            rolled += 1
    return rolled / (rolled + handed)


def step_time_s(job) -> float | None:
    times = list(
        RankStatus.objects.filter(attempt__job=job, step_time_s__gt=0)
        .order_by("-attempt__number")
        .values_list("step_time_s", flat=True)[:64]
    )
    return statistics.median(times) if times else None


def compute(job) -> dict:
    cost = checkpoint_cost_s(job)
    mtbf = node_mtbf_s(job.cluster_id) / max(1, job.num_nodes)
    share = rollback_share(job)
    interval = young_daly_seconds(cost, mtbf / share)
    step = step_time_s(job)
    steps = max(1, round(_sig(interval) / _sig(step))) if step else None
    # Three significant digits: the fleet's ready seconds grow on every pass,
    # and a change in the fourth digit is not worth a write or a new directive.
    return {
        "cost_s": _sig(cost), "mtbf_s": _sig(mtbf), "rollback_share": _sig(share),
        "step_time_s": _sig(step) if step else None,
        "interval_s": _sig(interval), "interval_steps": steps,
    }


def _sig(x: float) -> float:
    return float(f"{x:.3g}")


def refresh(job) -> bool:
    """Recompute for a job under policy auto; store only on change."""
    if job.checkpoint_policy != TrainingJob.CheckpointPolicy.AUTO:
        return False
    inputs = compute(job)
    steps = inputs.pop("interval_steps")
    if inputs == job.checkpoint_interval_inputs and steps == job.checkpoint_interval_steps:
        return False
    TrainingJob.objects.filter(pk=job.pk).update(
        checkpoint_interval_inputs=inputs, checkpoint_interval_steps=steps
    )
    job.checkpoint_interval_inputs, job.checkpoint_interval_steps = inputs, steps
    return True
