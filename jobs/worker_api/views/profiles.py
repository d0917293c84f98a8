from regatta import contract
from rest_framework import status
from rest_framework.response import Response

from jobs.profiling import record_trace
from jobs.worker_api import reports as worker_reports
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView


class ProfileTraceView(WorkerView):
    """A rank wrote its profiler trace (worker_image/regatta/profiling.py).
    Idempotent per (attempt, request, rank): 201 the first time, 200 after."""

    @worker_schema.profiles
    def post(self, request, attempt_id):
        f = self.fields(contract.PROFILE)
        report = worker_reports.profile_report(f, self.attempt)
        f.check()
        trace, created = record_trace(self.attempt, report)
        return Response({"trace": trace.pk, "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
