"""The goodput ledger: where each job's GPU time went.

Every entry is keyed, and booking the same key twice stores it once, so a
reconcile pass that runs again (or on two workers) never double-counts.

Categories, and when they are booked:
- queued: from entering the queue to admission (at admission);
- productive: an attempt's time from its first step to its end, less what
  the failure rolled back, the hang before detection and checkpoint stalls;
- rollback: from the checkpoint the failure fell back to (or the attempt's
  first step, if newer) to the failure; lowered at the next launch if it
  resumes from a later step (`revise_rollback`);
- preemption: the work a preempted gang lost when it could not checkpoint
  within `preemption_checkpoint_wait_s` (from its newest checkpoint, or its
  first step if newer, to the stop);
- hang: from the silent rank's last heartbeat to the detection;
- checkpoint: the blocking seconds of the attempt's checkpoints;
- restart: the GPUs held from a failure's detection to the next attempt's
  first step (only a restart books it);
- startup: the GPUs held from the job's admission to its first attempt's
  first step (no failure came before it).
gpu_seconds = seconds × the job's GPUs.

An eval run's lines (jobs/evals/) are all booked as `eval`, whatever they
were spent on, so a team's productive and lost training time never mixes
with its evaluations'; its queueing (no GPUs held) stays `queued`.

While an attempt runs, each reconcile pass keeps its productive and
checkpoint lines current (`book_running`), so the ledger, and the API that
sums it, shows a running job's time so far. They carry the same keys as the
lines booked when the attempt ends, which replace them: a span is counted
once, whichever pass saw it last.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F, Sum

from checkpoints.models import Checkpoint
from jobs.goodput.models import GoodputEntry
from jobs.models import JobAttempt

Category = GoodputEntry.Category


def _category(job, category: str) -> str:
    if job.is_eval and category != Category.QUEUED:
        return Category.EVAL
    return category


def book(job, category: str, seconds: float, key: str, *, attempt=None, detail: str = "",
         now=None) -> GoodputEntry | None:
    seconds = max(0.0, float(seconds))
    defaults = {
        "category": _category(job, category), "seconds": seconds,
        "gpu_seconds": seconds * job.world_size, "attempt": attempt, "detail": detail[:300],
    }
    if now is not None:
        defaults["created_at"] = now
    try:
        with transaction.atomic():
            entry, _ = GoodputEntry.objects.get_or_create(job=job, key=key, defaults=defaults)
    except IntegrityError:
        entry = GoodputEntry.objects.filter(job=job, key=key).first()
    return entry


def _settle(job, category: str, seconds: float, key: str, *, attempt, detail: str,
            now) -> None:
    """Book an ended attempt's line, replacing the running figure kept under its key."""
    seconds = max(0.0, float(seconds))
    fields = {"category": _category(job, category), "seconds": seconds,
              "gpu_seconds": seconds * job.world_size, "attempt": attempt,
              "detail": detail[:300], "created_at": now}
    if GoodputEntry.objects.filter(job=job, key=key).update(**fields):
        return
    try:
        with transaction.atomic():
            GoodputEntry.objects.create(job=job, key=key, **fields)
    except IntegrityError:  # a running figure landed in between: the final one wins
        GoodputEntry.objects.filter(job=job, key=key).update(**fields)


def _keep_current(job, category: str, seconds: float, key: str, *, attempt, detail: str,
                  now) -> None:
    """Set a live attempt's line to its figure so far; never touch it once the
    attempt has ended (its final line is booked then)."""
    seconds = max(0.0, float(seconds))
    fields = {"category": _category(job, category), "seconds": seconds,
              "gpu_seconds": seconds * job.world_size, "detail": detail[:300],
              "created_at": now}
    if GoodputEntry.objects.filter(job=job, key=key, attempt__ended_at__isnull=True).update(
            **fields):
        return
    if not JobAttempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).exists():
        return
    try:
        with transaction.atomic():
            GoodputEntry.objects.create(job=job, key=key, attempt=attempt, **fields)
    except IntegrityError:  # the final line is there already
        pass


def _stalls(attempt) -> float:
    return (
        Checkpoint.objects.filter(attempt=attempt).aggregate(s=Sum("blocking_seconds"))["s"] or 0.0
    )


def queueing_entry(job, since, now) -> GoodputEntry | None:
    """The queued span ending at the job's admission, unsaved: an admission
    pass books all of its admissions' spans in one insert
    (`book_queueing_many`)."""
    if since is None:
        return None
    seconds = max(0.0, (now - since).total_seconds())
    return GoodputEntry(job=job, category=Category.QUEUED, seconds=seconds,
                        gpu_seconds=seconds * job.world_size, detail="waiting for admission",
                        key=f"queued-{int(since.timestamp() * 1000)}", created_at=now)


def book_queueing_many(entries) -> None:
    """Keyed like every line: a span booked already is left as it is."""
    entries = [e for e in entries if e is not None]
    if entries:
        GoodputEntry.objects.bulk_create(entries, ignore_conflicts=True, batch_size=500)


def book_running(job, attempt, now) -> None:
    """The running attempt's productive time and checkpoint stalls so far."""
    if attempt.first_step_at is None or attempt.ended_at is not None:
        return
    stalls = _stalls(attempt)
    if stalls:
        _keep_current(job, Category.CHECKPOINT, stalls, f"attempt-{attempt.id}-checkpoint",
                      attempt=attempt, detail="blocking checkpoint saves (so far)", now=now)
    ran = (now - attempt.first_step_at).total_seconds()
    _keep_current(job, Category.PRODUCTIVE, ran - stalls, f"attempt-{attempt.id}-productive",
                  attempt=attempt, detail=f"attempt {attempt.number} (running)", now=now)


def book_attempt_end(job, attempt, *, ended_at, rollback_s: float = 0.0, hang_s: float = 0.0,
                     detail: str = "", lost_as: str = Category.ROLLBACK) -> None:
    """Book the span of an attempt that ended (succeeded, failed or stopped).
    `lost_as`: the category of the work rolled back (`preemption` for a
    preempted gang that could not checkpoint in time)."""
    stalls = _stalls(attempt)
    if stalls:
        _settle(job, Category.CHECKPOINT, stalls, f"attempt-{attempt.id}-checkpoint",
                attempt=attempt, detail="blocking checkpoint saves", now=ended_at)
    if rollback_s > 0:
        book(job, lost_as, rollback_s, f"attempt-{attempt.id}-{lost_as}",
             attempt=attempt, detail=detail or "work since the checkpoint resumed from",
             now=ended_at)
    if hang_s > 0:
        book(job, Category.HANG, hang_s, f"attempt-{attempt.id}-hang", attempt=attempt,
             detail="silent ranks before the deadline fired", now=ended_at)
    if attempt.first_step_at is not None:
        ran = (ended_at - attempt.first_step_at).total_seconds()
        productive = ran - rollback_s - hang_s - stalls
        _settle(job, Category.PRODUCTIVE, productive, f"attempt-{attempt.id}-productive",
                attempt=attempt, detail=f"attempt {attempt.number}", now=ended_at)


def revise_rollback(job, attempt, *, seconds_lost: float, detail: str) -> None:
    """Lower an ended attempt's rollback line to what its successor's resume
    really lost. The line is booked when the failure is handled, against the
    newest checkpoint then; the survivors' hand-over of a later step may be
    recorded after that (its upload ends within the stop's grace), and the
    next attempt resumes from it. The seconds between the two were trained,
    not lost: they go back to the attempt's productive line. Never raises a
    line (a person's restart_from_step is a choice, not a loss), so booking
    it again changes nothing."""
    seconds_lost = max(0.0, float(seconds_lost))
    key = f"attempt-{attempt.id}-{Category.ROLLBACK}"
    with transaction.atomic():
        line = GoodputEntry.objects.select_for_update().filter(job=job, key=key).first()
        if line is None or line.seconds <= seconds_lost:
            return
        regained = line.seconds - seconds_lost
        GoodputEntry.objects.filter(pk=line.pk).update(
            seconds=seconds_lost, gpu_seconds=seconds_lost * job.world_size,
            detail=detail[:300])
        GoodputEntry.objects.filter(job=job, key=f"attempt-{attempt.id}-productive").update(
            seconds=F("seconds") + regained,
            gpu_seconds=F("gpu_seconds") + regained * job.world_size)


def book_restart(job, previous, attempt) -> None:
    """The GPUs held before `attempt`'s first step: since the previous
    attempt ended (the failure's detection), or since the job's admission
    when a trip back to the queue came after it: restart latency. The job's
    first attempt books start-up instead, from its admission (its queueing
    is booked apart, up to the admission)."""
    if attempt.first_step_at is None:
        return
    since = [t for t in (previous.ended_at if previous else None, job.admitted_at) if t]
    start = max(since) if since else attempt.created_at
    seconds = (attempt.first_step_at - start).total_seconds()
    if previous is None:
        book(job, Category.STARTUP, seconds, f"startup-{attempt.id}", attempt=attempt,
             detail=f"start-up: admission → first step of attempt {attempt.number}",
             now=attempt.first_step_at)
        return
    book(job, Category.RESTART, seconds, f"restart-{attempt.id}", attempt=attempt,
         detail=f"attempt {previous.number} → {attempt.number}", now=attempt.first_step_at)


def summarize(entries) -> dict:
    """Seconds and GPU-seconds per category, and the productive share."""
    rows = entries.values("category").annotate(s=Sum("seconds"), g=Sum("gpu_seconds"))
    out = {c.value: {"seconds": 0.0, "gpu_seconds": 0.0} for c in Category}
    for row in rows:
        out[row["category"]] = {"seconds": row["s"] or 0.0, "gpu_seconds": row["g"] or 0.0}
    # Eval runs' GPU time is shown apart, never in training's ratio.
    held = sum(v["gpu_seconds"] for k, v in out.items()
               if k not in (Category.QUEUED, Category.EVAL))
    productive = out[Category.PRODUCTIVE]["gpu_seconds"]
    return {"categories": out, "goodput_ratio": (productive / held) if held else None}
