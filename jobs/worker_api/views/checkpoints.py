from regatta import contract
from rest_framework import status
from rest_framework.response import Response

from jobs.worker_api import reports as worker_reports
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView


class CheckpointCommittedView(WorkerView):
    """Rank 0 wrote step-N's commit marker. Idempotent per (job, step): 201
    the first time, 200 on a repeat."""

    @worker_schema.checkpoints
    def post(self, request, attempt_id):
        f = self.fields(contract.CHECKPOINT)
        values = worker_reports.checkpoint_values(f, self.attempt.job)
        f.check()
        checkpoint, created = worker_reports.record_checkpoint(self.attempt, values)
        return Response({"checkpoint": checkpoint.pk, "step": values["step"],
                         "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
