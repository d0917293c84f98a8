"""Evaluation runs on spare capacity (docs/evaluation.md).

A training job whose spec carries an `eval` block gets, for every checkpoint
its policy picks (every checkpoint, or every Nth), a short run of its own:
an eval run, a TrainingJob of kind `eval` with `parent` and `eval_step`. It
loads exactly that checkpoint from the parent's storage (read-only: it never
writes one), runs the built-in trainer's eval mode or the job's own eval
entrypoint, and reports `val_loss` and friends at that step.

- Made by the parent's reconcile (`schedule`), level-triggered: each pass
  looks at the parent's checkpoints and makes the runs that are missing;
  the unique (parent, eval_step) key makes a pass that runs twice, or on two
  workers, make each run once.
- Admitted by the ordinary admission pass under the parent's team quota, on
  its own pool, at `EVAL_PRIORITY`: below every training job, so it never
  holds one up in the queue, and a training job short of quota or nodes
  preempts it (jobs/admission/sharing.py). It does not count against the team's
  running-jobs limit: it is part of a job that already counts.
- Preempted at once (nothing to checkpoint) and requeued; it starts again
  from the same checkpoint. A failed rank restarts it under its own budgets;
  the parent is never touched beyond its timeline.
- Retention keeps a checkpoint while a run that evaluates it is live
  (jobs/checkpointing.protected_steps).
- Results: when the run succeeds its metrics at the step and its samples are
  kept in `eval_result`; the parent's series (jobs/metrics/series.py) and metric
  names include them, so its chart shows `val_loss` by checkpoint step.
- Goodput: every line of an eval run's ledger is booked as `eval`
  (jobs/goodput/), never as training's productive or lost time.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.db.models import Max

from checkpoints import verification
from checkpoints.models import Checkpoint
from clusters.models import NodePool
from controlplane.lib.tasks import RECONCILE_JOB
from jobs.checkpointing import open_job_storage
from jobs.metrics.models import MetricPoint
from jobs.models import EVAL_PRIORITY, JobEvent, Phase, TrainingJob

log = logging.getLogger(__name__)

# The trainer's eval-mode knobs an eval block may set (trainer/config.py).
BUILTIN_KNOBS = {"max_batches": "val_batches", "samples": "eval_samples",
                 "sample_tokens": "eval_sample_tokens"}
# Restarts an eval run may spend per failure class: a code error fails it at
# once; a killed rank or a lost node restarts it.
EVAL_RESTART_BUDGETS = {"code": 0, "transient": 3, "hardware": 3, "preempted": 100, "hang": 2,
                        "process": 2}
# The event an eval program sends with its samples (the SDK's `evaluated`).
EVALUATED = "TrainerEvaluated"
# Parent timeline events, by the eval run's new phase.
PARENT_EVENTS = {
    Phase.STARTING: "EvalStarted",
    Phase.RESTARTING: "EvalRestarting",
    Phase.SUCCEEDED: "EvalFinished",
    Phase.FAILED: "EvalFailed",
    Phase.CANCELLED: "EvalCancelled",
}
LIVE = (Phase.PENDING, Phase.QUEUED, Phase.ADMITTED, Phase.STARTING, Phase.RUNNING,
        Phase.RESTARTING)


def picks(policy: dict, ordinal: int) -> bool:
    """Whether the policy evaluates the `ordinal`-th checkpoint (from 1) the
    interval produced."""
    if not policy:
        return False
    if policy.get("every_checkpoint"):
        return True
    every = int(policy.get("every_n_checkpoints") or 0)
    return every > 0 and ordinal % every == 0


def _candidates(job: TrainingJob) -> list[Checkpoint]:
    """The parent's loadable checkpoints past its newest evaluated step that
    the policy picks. The ordinal counts every checkpoint the interval
    produced, deleted and corrupt ones too (their rows stay), so it never
    shifts; emergency saves and those on an abandoned branch are no part of
    it. Only the rows past the newest evaluated step are read (a pass runs
    every second or so, and a long job has thousands of rows): one older
    that could not be read when its turn came is not gone back to."""
    newest = job.evals.aggregate(newest=Max("eval_step"))["newest"]
    rows = (Checkpoint.objects.filter(job=job, emergency=False)
            .exclude(state=Checkpoint.State.ABANDONED).order_by("step"))
    before = rows.filter(step__lte=newest).count() if newest is not None else 0
    fresh = rows.filter(step__gt=newest) if newest is not None else rows
    return [c for ordinal, c in enumerate(fresh, start=before + 1)
            if c.state in Checkpoint.LOADABLE and picks(job.eval_policy, ordinal)]


def schedule(job: TrainingJob, now, storage=None) -> list[TrainingJob]:
    """Make the eval runs the parent's policy asks for and does not have;
    each checkpoint is verified first (only a verified one is evaluated).
    Idempotent. Returns the runs made by this call."""
    if job.is_eval or not job.eval_policy or job.cancel_requested_at is not None:
        return []
    made = []
    for checkpoint in _candidates(job):
        if checkpoint.state != Checkpoint.State.VERIFIED:
            storage = storage or open_job_storage(job)
            ok, _ = verification.verify(checkpoint, storage, now)
            if not ok:
                # Corrupt: never evaluated. Unreadable: a later pass tries
                # again, unless a newer checkpoint's run was made first.
                continue
        run = _make(job, checkpoint, now)
        if run is not None:
            made.append(run)
    return made


def eval_spec(job: TrainingJob, step: int) -> dict:
    """The eval run's spec, from the parent's and its eval block."""
    policy = job.eval_policy
    # By name, as the spec gave it: a pool renamed or removed since falls
    # back to the parent's own, where the run can still be placed.
    pool = (NodePool.objects.filter(cluster_id=job.cluster_id, name=policy.get("pool"))
            .values_list("id", flat=True).first()) or job.pool_id
    entrypoint = list(policy.get("entrypoint") or [])
    if entrypoint:
        hyper = dict(job.hyperparameters or {})
    else:
        hyper = {**(job.hyperparameters or {}), "mode": "eval"}
        hyper.update({field: policy[key] for key, field in BUILTIN_KNOBS.items()
                      if key in policy})
        # The parent's in-loop validation is no part of an eval (its faults
        # are: a slowed run's eval is slowed alike, docs/evaluation.md).
        hyper.pop("val_every_steps", None)
    return {
        "name": f"{job.name} eval@{step}"[:100], "team_id": job.team_id,
        "cluster_id": job.cluster_id, "pool_id": pool,
        "created_by_id": job.created_by_id, "image": job.image, "entrypoint": entrypoint,
        "args": list(policy.get("args") or []), "env": dict(job.env or {}),
        "completion": TrainingJob.Completion.EXIT, "num_nodes": policy.get("nodes", 1),
        "gpus_per_node": policy.get("gpus_per_node", 1), "strategy": job.strategy,
        "hyperparameters": hyper, "restart_budgets": dict(EVAL_RESTART_BUDGETS),
        "priority": EVAL_PRIORITY, "spot_allowed": True, "kind": TrainingJob.Kind.EVAL,
        "parent_id": job.pk, "eval_step": step,
    }


def _make(job: TrainingJob, checkpoint: Checkpoint, now) -> TrainingJob | None:
    try:
        with transaction.atomic():
            run = TrainingJob.objects.create(created_at=now, **eval_spec(job, checkpoint.step))
            run.record("Submitted", f"evaluates step {checkpoint.step} of job #{job.pk}",
                       now=now, evidence={"parent": job.pk, "step": checkpoint.step,
                                          "world_size": run.world_size})
            job.record("EvalScheduled", f"eval run #{run.pk} of step {checkpoint.step}",
                       now=now, evidence={"eval_job": run.pk, "step": checkpoint.step,
                                          "uri": checkpoint.uri})
            RECONCILE_JOB.soon(run.pk)
    except IntegrityError:  # another pass made it first
        return None
    return run


def source_checkpoint(run: TrainingJob) -> Checkpoint | None:
    """The parent's checkpoint the run evaluates, while it can be loaded."""
    return (Checkpoint.objects.filter(job_id=run.parent_id, step=run.eval_step,
                                      state__in=Checkpoint.LOADABLE).first())


def result_of(run: TrainingJob, attempt) -> dict:
    """What the run reported at its step: its metrics (rank 0's where rank 0
    sent them) and the samples of its last `evaluated` event."""
    metrics: dict[str, float] = {}
    rows = (MetricPoint.objects.filter(job=run, attempt=attempt, step=run.eval_step)
            .order_by("-rank").values_list("name", "value"))
    for name, value in rows:  # rank 0 last: its value wins
        metrics[name] = value
    event = (JobEvent.objects.filter(job=run, attempt=attempt, kind=EVALUATED)
             .order_by("-id").first())
    samples = (event.evidence or {}).get("samples") if event else None
    return {"metrics": metrics, "samples": samples if isinstance(samples, list) else [],
            "attempt": attempt.number}


def note_phase(run: TrainingJob, before: str, now) -> None:
    """A reconcile pass moved the eval run from `before`: the parent's
    timeline hears of it (started, preempted, restarting, ended)."""
    if not run.is_eval or run.phase == before or run.parent_id is None:
        return
    parent = TrainingJob.objects.filter(pk=run.parent_id).first()
    if parent is None:
        return
    kind = PARENT_EVENTS.get(run.phase)
    if run.phase == Phase.QUEUED and before in TrainingJob.HOLDS_GPUS:
        kind = "EvalPreempted"
    if kind is None:
        return
    metrics = (run.eval_result or {}).get("metrics", {})
    evidence = {"eval_job": run.pk, "step": run.eval_step, "phase": run.phase, **metrics}
    attempts = list(run.attempts.order_by("-number")[:2])
    if run.phase == Phase.STARTING and len(attempts) > 1:
        # A restart without backoff relaunches in the pass that saw the
        # failure: the parent hears of the restart, with its cause.
        kind = "EvalRestarted"
        evidence.update(attempt=attempts[0].number, failure_class=attempts[1].failure_class,
                        failure_reason=attempts[1].failure_reason[:300])
    if run.phase == Phase.SUCCEEDED and "val_loss" in metrics:
        message = f"step {run.eval_step}: val_loss {metrics['val_loss']:.4f}"
        if "val_perplexity" in metrics:
            message += f", perplexity {metrics['val_perplexity']:.2f}"
    elif kind == "EvalRestarted":
        message = (f"eval run #{run.pk} of step {run.eval_step}: attempt "
                   f"{evidence['attempt']} after {evidence['failure_class'] or 'a stop'}")
    else:
        message = f"eval run #{run.pk} of step {run.eval_step}: {run.phase}"
        if run.phase == Phase.QUEUED:
            message += f" ({run.pending_reason})" if run.pending_reason else ""
    parent.record(kind, message[:1000], now=now, evidence=evidence)


def cancel_live(job: TrainingJob, actor: str, now) -> None:
    """The parent was cancelled: its eval runs not yet done go too."""
    for run in TrainingJob.objects.filter(parent=job, phase__in=LIVE):
        run.request_cancel(actor, now=now)
        RECONCILE_JOB.soon(run.pk)


def series_points(job_id: int, name: str) -> list[tuple[int, float]]:
    """The parent's chart points of one metric its eval runs reported,
    (checkpoint step, value), from the runs that succeeded."""
    points = []
    for step, result in (TrainingJob.objects.filter(parent_id=job_id, phase=Phase.SUCCEEDED)
                         .values_list("eval_step", "eval_result")):
        value = ((result or {}).get("metrics") or {}).get(name)
        if isinstance(value, int | float):
            points.append((step, float(value)))
    return sorted(points)


def metric_names(job_id: int) -> set[str]:
    names: set[str] = set()
    for result in (TrainingJob.objects.filter(parent_id=job_id, phase=Phase.SUCCEEDED)
                   .values_list("eval_result", flat=True)):
        names.update(((result or {}).get("metrics") or {}).keys())
    return names
