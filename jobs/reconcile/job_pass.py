"""Job reconcile: read the job's desired state and the fleet's actual state,
act to close the difference, and say when to look again.

Level-triggered and idempotent: `reconcile_job_unlocked(job_id, now)` may run twice,
or on two workers at once (the Redis lock in `reconcile_job_locked` makes the
second wait its turn, and every state change is a conditional update), and
changes nothing more than one run would.

Phases: pending → queued → admitted → starting (preflight, launch) → running
(first heartbeat with a step) → succeeded; on a failure → restarting →
starting ...; failed or cancelled end it. See docs/fleet.md.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from controlplane.lib import runner
from controlplane.lib.reconcile import Result
from jobs import admission, evals, goodput
from jobs.checkpointing import interval as checkpoint_interval
from jobs.checkpointing import open_job_storage
from jobs.context import Ctx
from jobs.reconcile import drain, finish, launch, preemption, startup, waiting
from jobs.recovery import evidence, handle
from jobs.recovery.detect import ALL_REPORTING, Failure, detect
from jobs.worker_api import undelivered

from ..models import NO_HEARTBEATS, JobAttempt, Phase, RankStatus, TrainingJob

__all__ = ["JOBS", "due_job_ids", "reconcile_job_unlocked", "reconcile_job_locked"]

# With nothing asked, a live job is still looked at this often (the safety net).
IDLE_REQUEUE_S = 60.0
STRAGGLERS_FOR = timedelta(minutes=10)


def due_job_ids(now, limit: int = 10_000) -> list[int]:
    return list(
        TrainingJob.objects.exclude(phase__in=TrainingJob.TERMINAL)
        .filter(Q(next_reconcile_at__isnull=True) | Q(next_reconcile_at__lte=now))
        .order_by("next_reconcile_at", "id")
        .values_list("id", flat=True)[:limit]
    )


def reconcile_job_locked(job_id: int, now=None) -> Result | None:
    """The entry point tasks call: the one reconcile runner (lock, error
    classes). None: another worker holds the job."""
    return runner.run(JOBS, job_id, now or timezone.now())


def reconcile_job_unlocked(job_id: int, now=None) -> Result:
    """One pass, with no lock and no error classes: the step the runner
    takes inside `reconcile_job_locked`, which is what tasks call. Its errors are
    raised as they are; tests call it to drive a pass at a chosen `now`."""
    now = now or timezone.now()
    job = TrainingJob.objects.select_related("cluster", "pool", "team").filter(pk=job_id).first()
    if job is None or job.is_terminal:
        return Result.done("nothing to do")
    ctx = Ctx(job, now)
    before = job.phase
    result = _step(ctx)
    job.refresh_from_db()
    # Level-triggered: each pass makes the eval runs the job's checkpoints
    # call for and do not have yet (the pass that ends the job included, so
    # its final checkpoint is evaluated too); an eval run's own moves are
    # written on its parent's timeline.
    evals.schedule(job, now)
    evals.note_phase(job, before, now)
    after = result.requeue_after
    if job.is_terminal:
        nxt = None
    else:
        nxt = now + timedelta(seconds=IDLE_REQUEUE_S if after is None else after)
    # A pass that got this far succeeded: an error an earlier one met is over.
    conditions = [c for c in job.conditions or [] if c.get("type") != ERROR_CONDITION]
    TrainingJob.objects.filter(pk=job_id).update(
        next_reconcile_at=nxt, observed_generation=job.generation, conditions=conditions,
    )
    return result


ERROR_CONDITION = "ReconcileError"


class _Jobs:
    """Jobs as the reconcile runner sees them (controlplane/lib/runner.py)."""

    name = "job"
    # A job is asked for by what concerns it (a submit, an admission, a
    # report): an ask during a pass must not wait for the job's next due time.
    keeps_asks = True

    def reconcile(self, job_id: int, now) -> Result:
        return reconcile_job_unlocked(job_id, now)

    def errors_in_a_row(self, job_id: int) -> int:
        conditions = TrainingJob.objects.filter(pk=job_id).values_list("conditions", flat=True)
        found = next((c for c in conditions.first() or [] if c.get("type") == ERROR_CONDITION),
                     None)
        return int(found["count"]) if found else 0

    def record_error(self, job_id: int, now, error: runner.ReconcileError) -> None:
        job = TrainingJob.objects.filter(pk=job_id).first()
        if job is None:
            return
        previous = next((c for c in job.conditions or [] if c.get("type") == ERROR_CONDITION),
                        None)
        conditions = [c for c in job.conditions or [] if c.get("type") != ERROR_CONDITION]
        conditions.append({"type": ERROR_CONDITION, **error.as_condition(now)})
        TrainingJob.objects.filter(pk=job_id).update(
            conditions=conditions, last_error=error.message[:5000],
            next_reconcile_at=now + timedelta(seconds=error.retry_after))
        # One event per distinct error, not one per retry of the same.
        if previous is None or previous.get("message") != error.message[:1000]:
            job.record(ERROR_CONDITION, error.message[:1000], now=now,
                       evidence={"error_class": error.error_class, "count": error.count,
                                 "retry_after_s": error.retry_after})

    def clear_error(self, job_id: int) -> None:
        pass  # reconcile_job_unlocked's own last write drops the condition


JOBS = _Jobs()


def _step(ctx: Ctx) -> Result:
    job = ctx.job
    if job.cancel_requested_at is not None:
        return finish.cancel(ctx)
    if job.phase == Phase.PENDING:
        job.transition(Phase.QUEUED, reason="Queued", now=ctx.now,
                       message=f"waiting for {job.world_size} GPUs on {ctx.cluster.name}")
        admission.request_admission(job.cluster_id)
    if job.phase == Phase.QUEUED:
        # Admission is the cluster's pass (jobs/admission/); a queued job only
        # carries the reason that pass left it.
        return Result.after(ctx.config.queue_interval_s, job.pending_reason)
    if job.phase in (Phase.ADMITTED, Phase.RESTARTING):
        result = launch.start(ctx)
        job.refresh_from_db()
        if job.phase == Phase.QUEUED:
            # Back in the queue (no nodes at launch, a failed preflight) with
            # the launch's reason; the place it takes in the queue goes with it.
            admission.note_position(job)
            admission.request_admission(job.cluster_id)
        return result
    if job.phase in (Phase.STARTING, Phase.RUNNING):
        return _watch(ctx)
    return Result.after(IDLE_REQUEUE_S)


def _watch(ctx: Ctx) -> Result:
    job, now = ctx.job, ctx.now
    attempt = ctx.live_attempt()
    if attempt is None:
        # A pass died between ending the attempt and moving the job on.
        job.transition(Phase.RESTARTING, reason="Restarting", now=now,
                       message="the attempt ended without the job moving on; relaunching")
        return Result.after(0)
    if attempt.state == JobAttempt.State.PREFLIGHT:
        return launch.start(ctx)
    status = ctx.provider.observe(attempt.provider_ref)
    _collect_undelivered(ctx, attempt, status)
    _progress(ctx, attempt, status)
    startup.watch(ctx, attempt, status)
    # Before detect: a victim's exit 83 after its checkpoint is what it was
    # asked for, not a failure.
    evicted = preemption.check(ctx, attempt, status)
    if evicted is not None:
        return evicted
    if _person_asked_restart(ctx, attempt):
        return _relaunch_now(ctx, Result.after(0, "restart asked"))
    found = detect(ctx, attempt, status)
    if found.waits:
        # A drain or a spot notice on its nodes is acted on even before the
        # gang starts (its wait for a checkpoint is bounded).
        result = drain.check(ctx, attempt)
        if result is not None:
            return _relaunch_now(ctx, result)
        held = waiting.on_held_nodes(ctx, attempt)
        if held is not None:
            return _relaunch_now(ctx, handle.handle(ctx, attempt, held))
        return waiting.note(ctx, attempt, found.waits)
    waiting.clear(ctx, attempt)
    if found.wait_for_root_cause:
        return Result.after(0.5, "waiting for the root cause")
    if found.failure is not None:
        # A killed or silent rank takes its node out only on the node's own
        # evidence (jobs/recovery/evidence.py).
        failure = evidence.attribute(ctx, attempt, found.failure)
        return _relaunch_now(ctx, handle.handle(ctx, attempt, failure))
    if status.state == "succeeded":
        return finish.succeed(ctx, attempt)
    if status.state == "unknown":
        return handle.handle(ctx, attempt, Failure(
            "transient", f"the provider lost the attempt: {status.message}", replace=False))
    result = drain.check(ctx, attempt)
    if result is not None:
        return _relaunch_now(ctx, result)
    checkpoint_interval.refresh(job)
    return Result.after(ctx.config.observe_interval_s, "watching")


def _collect_undelivered(ctx: Ctx, attempt: JobAttempt, status) -> None:
    """What ranks handed off instead of delivering (jobs/worker_api/undelivered.py)."""
    job = ctx.job
    ended = status.state in ("succeeded", "failed")
    # Ranks of the attempt before this one, stopped after its end was
    # judged, hand off as they exit: looked for while this one is young.
    after_restart = attempt.number > 1 and attempt.created_at >= ctx.now - STRAGGLERS_FOR
    if not (ended or after_restart):
        return
    storage = open_job_storage(job.parent if job.is_eval else job)
    if ended:
        # Before the end is judged: the final checkpoint's report or the
        # `finished` event may be among what the ranks could not deliver.
        undelivered.collect(attempt, storage, ctx.now)
    if after_restart:
        undelivered.collect_ended(job, storage, ctx.now)


def _relaunch_now(ctx: Ctx, result: Result) -> Result:
    """A restart without backoff launches in the same pass: every second
    between the failure and the next first step is goodput lost."""
    ctx.job.refresh_from_db()
    if ctx.job.phase == Phase.RESTARTING and result.requeue_after == 0:
        return launch.start(ctx)
    return result


def _progress(ctx: Ctx, attempt: JobAttempt, status) -> None:
    job, now = ctx.job, ctx.now
    attempt.refresh_from_db()
    _note_all_reporting(ctx, attempt)
    if attempt.last_step != job.current_step and attempt.last_step > 0:
        TrainingJob.objects.filter(pk=job.pk).update(current_step=attempt.last_step)
        job.current_step = attempt.last_step
    silent = _running_without_heartbeats(ctx, attempt, status)
    if attempt.first_step_at is None and attempt.last_step == 0 and not silent:
        return
    if attempt.state == JobAttempt.State.STARTING:
        attempt.first_step_seen(now)
    if job.phase == Phase.STARTING:
        message = (f"attempt {attempt.number}: every process alive; no heartbeats "
                   "(the program does not report), watched by its processes" if silent
                   else f"first step of attempt {attempt.number}")
        job.transition(Phase.RUNNING, reason="Running", attempt=attempt, now=now,
                       message=message,
                       evidence={"step": attempt.last_step, "heartbeats": not silent})
        previous = (JobAttempt.objects.filter(job=job, number__lt=attempt.number)
                    .order_by("-number").first())
        goodput.book_restart(job, previous, attempt)
    goodput.book_running(job, attempt, now)


def _running_without_heartbeats(ctx: Ctx, attempt: JobAttempt, status) -> bool:
    """Whether the attempt runs a program that sends no heartbeats; keeps
    the job's NoHeartbeats condition (what the UI and CLI show) in step."""
    if not ctx.job.entrypoint:
        return False
    if RankStatus.objects.filter(attempt=attempt).exists():
        if ctx.condition(NO_HEARTBEATS) is not None:
            ctx.clear_condition(NO_HEARTBEATS)
        return False
    noted = ctx.condition(NO_HEARTBEATS)
    if noted is not None and noted.get("attempt") == attempt.id:
        return True
    alive = (status.state == "running" and status.nodes and all(n.running for n in status.nodes)
             # Pods not started yet (pulling, unschedulable) are not a program
             # that runs without reporting.
             and not status.start_issues)
    if not alive or attempt.started_at is None:
        return False
    # A program with no heartbeat this long after its launch, every process
    # alive, is taken to be one that never will send any.
    if (ctx.now - attempt.started_at).total_seconds() < ctx.config.no_heartbeat_grace_s:
        return False
    ctx.set_condition(NO_HEARTBEATS, attempt=attempt.id, processes=len(status.nodes),
                      since=ctx.now.timestamp())
    return True



def _note_all_reporting(ctx: Ctx, attempt: JobAttempt) -> None:
    """The start-up milestone between the launch and the first step: every
    rank heard from. The first-step deadline counts from here (detect.py)."""
    if attempt.first_step_at is not None:
        return
    noted = ctx.condition(ALL_REPORTING)
    if noted is not None and noted.get("attempt") == attempt.id:
        return
    reporting = RankStatus.objects.filter(attempt=attempt).count()
    if reporting < ctx.job.world_size:
        return
    ctx.set_condition(ALL_REPORTING, attempt=attempt.id, at=ctx.now.timestamp())
    ctx.job.record(ALL_REPORTING, f"all {reporting} ranks of attempt {attempt.number} report",
                   attempt=attempt, now=ctx.now, evidence={"ranks": reporting})


def _person_asked_restart(ctx: Ctx, attempt: JobAttempt) -> bool:
    """restart_from_step is spec: a new generation carrying it restarts the
    running gang from that step (once per generation)."""
    job = ctx.job
    if job.restart_from_step is None or job.generation <= job.observed_generation:
        return False
    if (ctx.condition("RestartFromStep") or {}).get("generation") == job.generation:
        return False
    ctx.provider.stop(attempt.provider_ref, grace_s=ctx.config.stop_grace_s)
    if attempt.end(JobAttempt.State.STOPPED, ctx.now,
                   failure_reason=f"restart from step {job.restart_from_step} asked"):
        goodput.book_attempt_end(job, attempt, ended_at=ctx.now)
    job.transition(Phase.RESTARTING, reason="RestartRequested", attempt=attempt, now=ctx.now,
                   message=f"restart from step {job.restart_from_step} asked",
                   evidence={"step": job.restart_from_step, "generation": job.generation})
    return True
