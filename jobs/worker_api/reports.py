"""What a rank reports, checked and stored: the writers behind the worker
endpoints (jobs/views/worker_*.py) and behind the collection of the reports
a rank could not deliver (jobs/worker_api/undelivered.py), so both paths refuse alike
and store each report once, however often it arrives."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from regatta import contract
from regatta import manifest as mf

from checkpoints.confinement import link_below_root, reported_step_uri_ok
from checkpoints.models import Checkpoint
from controlplane.lib.tasks import RECONCILE_JOB
from jobs.checkpointing import job_checkpoint_uri, on_abandoned_branch
from jobs.models import JobAttempt, JobEvent, RankStatus
from jobs.profiling import TraceReport, report_errors
from jobs.worker_api.fields import Fields

# Events after which the job should be looked at now, not at the next sweep.
URGENT = {"finished", "crashed", "emergency_checkpoint", "preempted"}


def event_kind(kind: str) -> str:
    return "Trainer" + "".join(part.capitalize() for part in kind.split("_"))


# --- events ------------------------------------------------------------------

def event_values(f: Fields) -> dict:
    return f.read(contract.EVENT)


def record_event(attempt: JobAttempt, values: dict) -> tuple[JobEvent, bool]:
    """The event onto the job's timeline; with a `key` already stored for
    this job, the stored event and False (a retry whose reply was lost)."""
    key = values["key"] or None
    if key and (event := JobEvent.objects.filter(job_id=attempt.job_id, key=key).first()):
        return event, False
    rank, node = values["rank"], values["node"]
    if not node:
        node = (RankStatus.objects.filter(attempt=attempt, rank=rank)
                .values_list("node_name", flat=True).first()) or "?"
    try:
        with transaction.atomic():
            event = attempt.job.record(
                event_kind(values["kind"]), values["message"], actor=f"worker:rank{rank}@{node}",
                evidence=values["data"], attempt=attempt, key=key)
            if values["kind"] in URGENT:
                RECONCILE_JOB.soon(attempt.job_id)
    except IntegrityError:
        # The same key, stored by a request running beside this one.
        if key is None:
            raise
        return JobEvent.objects.get(job_id=attempt.job_id, key=key), False
    return event, True


# --- checkpoints -------------------------------------------------------------

def checkpoint_values(f: Fields, job) -> dict:
    values = f.read(contract.CHECKPOINT)
    if "uri" not in f.errors and values["step"] is not None:
        _check_uri(f, job, values["step"], values["uri"])
    return values


def _check_uri(f: Fields, job, step: int, uri: str) -> None:
    """A worker reports only its own job's `step-<step>` folder: retention
    and resume later open whatever URI is stored here."""
    expected = f"{job_checkpoint_uri(job).rstrip('/')}/step-{step}"
    if not uri:
        f.errors["uri"] = ["Must not be blank."]
    elif not reported_step_uri_ok(job_checkpoint_uri(job), step, uri):
        f.errors["uri"] = [f"Must be this job's folder for step {step}: {expected}"]
    elif link := next(filter(None, (link_below_root(path) for path in (
            expected, f"{expected}/{mf.MANIFEST}", f"{expected}/{mf.MARKER}"))), None):
        # The folder (or its manifest) would be another one's, wherever it points.
        f.errors["uri"] = [f"{link} is a symbolic link: a checkpoint is reported from its "
                           "own real folder, with its own files."]


def record_checkpoint(attempt: JobAttempt, values: dict) -> tuple[Checkpoint, bool]:
    """Rank 0 wrote step-N's commit marker. Idempotent per (job, step)."""
    fields = {k: v for k, v in values.items() if k != "step"}
    step = values["step"]
    # An older gang's checkpoint past a person's restart point (its
    # emergency checkpoint arrives after the restart) is kept, abandoned.
    abandoned = on_abandoned_branch(attempt.job, attempt, step)
    state = Checkpoint.State.ABANDONED if abandoned else Checkpoint.State.COMMITTED
    reason = "written by a gang a restart from an earlier step replaced" if abandoned else ""
    with transaction.atomic():
        checkpoint, created = Checkpoint.objects.get_or_create(
            job_id=attempt.job_id, step=step,
            defaults={**fields, "attempt": attempt, "state": state, "state_reason": reason},
        )
        if not created and not abandoned and (
                checkpoint.attempt_id != attempt.pk
                or checkpoint.manifest_sha256 != fields["manifest_sha256"]):
            # A later attempt replayed this step after a rollback and wrote it anew:
            # the row describes the new files, to be verified again.
            checkpoint.transition(Checkpoint.State.COMMITTED, reason="", attempt=attempt,
                                  verified_at=None, **fields)
        RECONCILE_JOB.soon(attempt.job_id)
    return checkpoint, created


# --- profiles ----------------------------------------------------------------

def profile_report(f: Fields, attempt: JobAttempt) -> TraceReport | None:
    values = f.read(contract.PROFILE)
    if f.errors:
        return None
    report = TraceReport(**values)
    f.errors.update(report_errors(attempt, report))
    return None if f.errors else report

