from django.db import transaction
from rest_framework import status
from rest_framework.response import Response

from checkpoints.models import Checkpoint
from controlplane.lib.tasks import enqueue_on_commit

from .. import tasks
from . import worker_schema
from .worker_base import Fields, WorkerView


class CheckpointCommittedView(WorkerView):
    """Rank 0 wrote step-N's commit marker. Idempotent per (job, step): 201
    the first time, 200 on a repeat."""

    @worker_schema.checkpoints
    def post(self, request, attempt_id):
        f = Fields(self.body())
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
        if not fields["uri"] and "uri" not in f.errors:
            f.errors["uri"] = ["Must not be blank."]
        f.check()
        attempt = self.attempt
        with transaction.atomic():
            checkpoint, created = Checkpoint.objects.get_or_create(
                job_id=attempt.job_id, step=step,
                defaults={**fields, "attempt": attempt, "state": Checkpoint.State.COMMITTED},
            )
            if not created and (checkpoint.attempt_id != attempt.pk
                                or checkpoint.manifest_sha256 != fields["manifest_sha256"]):
                # A later attempt replayed this step after a rollback and wrote it anew:
                # the row describes the new files, to be verified again.
                Checkpoint.objects.filter(pk=checkpoint.pk).update(
                    **fields, attempt=attempt, state=Checkpoint.State.COMMITTED,
                    state_reason="", verified_at=None,
                )
            enqueue_on_commit(tasks.reconcile_job, attempt.job_id)
        return Response({"checkpoint": checkpoint.pk, "step": step, "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
