"""Profiling on demand (jobs/profiling/): ask a running job to profile its
next N steps, list the traces its ranks wrote, download one.

Scoped like the job: another team's job, and its traces, are 404."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import generics, serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from checkpoints import downloads
from jobs.api.base import JobScopedMixin
from jobs.api.downloads import FILE_RESPONSES, DownloadView, StorageUnavailable, storage_call
from jobs.checkpointing import open_job_storage
from jobs.profiling import requests as profile_requests
from jobs.profiling.serializers import ProfileTraceSerializer
from jobs.profiling.traces import traces_of
from jobs.validators import ProfileRequestValidator

ProfileRequest = inline_serializer("ProfileRequest", {
    "attempt": serializers.IntegerField(), "request_id": serializers.CharField(),
    "steps": serializers.IntegerField(),
    "created": serializers.BooleanField(help_text="false: a pending request was returned"),
})


class JobProfileView(JobScopedMixin, APIView):
    """Profile the next `steps` steps on every rank. 202 with a new request;
    200 with the pending one while its traces have not arrived (nothing
    written); 409 unless the job has a running attempt."""

    @extend_schema(request=ProfileRequestValidator,
                   responses={200: ProfileRequest, 202: ProfileRequest,
                              400: OpenApiResponse(), 409: OpenApiResponse()})
    def post(self, request, pk):
        job = self.get_job()
        body = ProfileRequestValidator(data=request.data)
        body.is_valid(raise_exception=True)
        attempt, request_id, created = profile_requests.profile_next(
            job, body.validated_data["steps"], request.user)
        return Response({"attempt": attempt.pk, "request_id": request_id,
                         "steps": attempt.profile_steps, "created": created},
                        status=202 if created else 200)


class JobProfileListView(JobScopedMixin, generics.ListAPIView):
    """The job's profiler traces, one per rank and profile, newest profile
    first; `?request_id=` narrows to one profile. Paged like every list."""

    serializer_class = ProfileTraceSerializer

    @extend_schema(parameters=[OpenApiParameter("request_id", str,
                                                description="only this profile's traces")])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        traces = traces_of(self.get_job()).order_by("-created_at", "request_id", "rank", "id")
        request_id = self.request.query_params.get("request_id")
        return traces.filter(request_id=request_id) if request_id else traces


class ProfileTraceFileView(JobScopedMixin, DownloadView):
    """One rank's trace (gzipped Chrome/Perfetto JSON), streamed from the
    job's storage."""

    @extend_schema(operation_id="job_profile_trace_download", responses=FILE_RESPONSES)
    def get(self, request, pk, trace_id):
        job = self.get_job()
        trace = get_object_or_404(traces_of(job), pk=trace_id)
        try:
            storage = open_job_storage(job)
        except Exception as exc:  # a bad storage setting: not the caller's fault
            raise StorageUnavailable(f"the job's storage cannot be opened: {exc}") from None
        try:
            opened = storage_call(downloads.open_storage_file, storage, trace.path)
        except downloads.NotThere:
            raise NotFound(f"trace {trace.pk} is no longer in the job's storage.") from None
        name = f"job-{job.pk}-{trace.path.split('/')[1]}-{trace.path.rsplit('/', 1)[-1]}"
        return self.stream(opened, name)


