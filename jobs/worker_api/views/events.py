from regatta import contract
from rest_framework import status
from rest_framework.response import Response

from jobs.worker_api import reports as worker_reports
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView


class EventView(WorkerView):
    """A trainer event (started, resumed, crashed, ...) onto the job's
    timeline. With a `key`, idempotent per (job, key): 201 the first time,
    200 with the stored event after."""

    @worker_schema.events
    def post(self, request, attempt_id):
        f = self.fields(contract.EVENT)
        values = worker_reports.event_values(f)
        f.check()
        event, created = worker_reports.record_event(self.attempt, values)
        return Response({"event": event.pk},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
