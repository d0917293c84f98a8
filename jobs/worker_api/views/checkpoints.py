from django.db import transaction
from rest_framework import status
from rest_framework.response import Response

from checkpoints.confinement import reported_step_uri_ok
from checkpoints.models import Checkpoint
from controlplane.lib.tasks import RECONCILE_JOB
from jobs.checkpointing import job_checkpoint_uri, on_abandoned_branch
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import Fields, WorkerView

FIELDS = ("uri", "bytes", "manifest_sha256", "save_seconds", "blocking_seconds", "emergency",
          "request_id")


class CheckpointCommittedView(WorkerView):
    """Rank 0 wrote step-N's commit marker. Idempotent per (job, step): 201
    the first time, 200 on a repeat."""

    @worker_schema.checkpoints
    def post(self, request, attempt_id):
        f = self.fields(("step", *FIELDS))
        step = f.int("step")
        fields = {
            "uri": f.str("uri", required=True, max_length=1000),
            "bytes": f.int("bytes", required=False, default=0, maximum=2**62),
            "manifest_sha256": f.str("manifest_sha256", max_length=64),
            "save_seconds": f.number("save_seconds", minimum=0) or 0.0,
            "blocking_seconds": f.number("blocking_seconds", minimum=0) or 0.0,
            "emergency": f.bool("emergency"),
            "request_id": f.str("request_id", max_length=64),
        }
        if "uri" not in f.errors and step is not None:
            _check_uri(f, self.attempt.job, step, fields["uri"])
        f.check()
        attempt = self.attempt
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
                Checkpoint.objects.filter(pk=checkpoint.pk).update(
                    **fields, attempt=attempt, state=Checkpoint.State.COMMITTED,
                    state_reason="", verified_at=None,
                )
            RECONCILE_JOB.soon(attempt.job_id)
        return Response({"checkpoint": checkpoint.pk, "step": step, "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def _check_uri(f: Fields, job, step: int, uri: str) -> None:
    """A worker reports only its own job's `step-<step>` folder: retention
    and resume later open whatever URI is stored here."""
    expected = f"{job_checkpoint_uri(job).rstrip('/')}/step-{step}"
    if not uri:
        f.errors["uri"] = ["Must not be blank."]
    elif not reported_step_uri_ok(job_checkpoint_uri(job), step, uri):
        f.errors["uri"] = [f"Must be this job's folder for step {step}: {expected}"]
