from django.utils import timezone
from regatta import contract
from rest_framework import status
from rest_framework.response import Response

from jobs.models import JobAttempt
from jobs.worker_api import heartbeats
from jobs.worker_api.heartbeats import Beat
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView


class HeartbeatView(WorkerView):
    """A rank is alive at `step`. The reply carries the attempt's directives.
    The token was checked without a read, and the attempt's state and
    directives come back from the heartbeat's own write (jobs/worker_api/heartbeats.py)."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        # Every 403 here carries `stop`, as the schema says: true only for an
        # attempt that has ended (the post below); a caller that is not this
        # attempt's worker is told nothing about the attempt.
        if response.status_code == status.HTTP_403_FORBIDDEN and isinstance(response.data, dict):
            response.data.setdefault("stop", False)
        return response

    @worker_schema.heartbeat
    def post(self, request, attempt_id):
        f = self.fields(contract.HEARTBEAT)
        values = f.read(contract.HEARTBEAT)
        f.check()
        claim = self.claim
        beat = Beat(job_id=claim.job_id, attempt_id=claim.attempt_id, rank=values["rank"],
                    node=values["node"], step=values["step"],
                    rates={key: values[key] for key in contract.PROGRESS}, gpu=values["gpu"])
        directives = heartbeats.record(beat, timezone.now())
        if directives is None:
            return self._ended()
        return Response({"directives": directives})

    def _ended(self) -> Response:
        state = JobAttempt.objects.filter(pk=self.claim.attempt_id).values_list(
            "state", flat=True).first()
        if state is None:
            return Response({"detail": "Invalid worker token."},
                            status=status.HTTP_401_UNAUTHORIZED)
        return Response({"detail": f"attempt {self.claim.attempt_id} has ended ({state}).",
                         "stop": True}, status=status.HTTP_403_FORBIDDEN)
