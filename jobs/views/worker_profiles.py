from rest_framework import status
from rest_framework.response import Response

from .. import worker_reports
from ..profiling import record_trace
from . import worker_schema
from .worker_base import WorkerView


class ProfileTraceView(WorkerView):
    """A rank wrote its profiler trace (worker_image/regatta/profiling.py).
    Idempotent per (attempt, request, rank): 201 the first time, 200 after."""

    @worker_schema.profiles
    def post(self, request, attempt_id):
        f = self.fields(worker_reports.PROFILE_FIELDS)
        report = worker_reports.profile_report(f, self.attempt)
        f.check()
        trace, created = record_trace(self.attempt, report)
        return Response({"trace": trace.pk, "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
