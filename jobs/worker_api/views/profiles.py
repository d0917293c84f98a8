from rest_framework import status
from rest_framework.response import Response

from jobs.profiling import MAX_PROFILE_STEPS, TraceReport, record_trace, report_errors
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView

FIELDS = ("request_id", "rank", "start_step", "steps", "uri", "bytes")


class ProfileTraceView(WorkerView):
    """A rank wrote its profiler trace (worker_image/regatta/profiling.py).
    Idempotent per (attempt, request, rank): 201 the first time, 200 after."""

    @worker_schema.profiles
    def post(self, request, attempt_id):
        f = self.fields(FIELDS)
        values = {
            "request_id": f.str("request_id", required=True, max_length=64),
            "rank": f.int("rank", maximum=65535),
            "start_step": f.int("start_step"),
            "steps": f.int("steps", maximum=MAX_PROFILE_STEPS),
            "uri": f.str("uri", required=True, max_length=1000),
            "bytes": f.int("bytes", required=False, default=0, maximum=2**62),
        }
        f.check()
        report = TraceReport(**values)
        errors = report_errors(self.attempt, report)
        if errors:
            f.errors.update(errors)
            f.check()
        trace, created = record_trace(self.attempt, report)
        return Response({"trace": trace.pk, "created": created},
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
