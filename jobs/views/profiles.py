"""Profiling on demand (jobs/profiling.py): ask a running job to profile its
next N steps, list the traces its ranks wrote, download one.

Scoped like the job: another team's job, and its traces, are 404."""

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import actor_for
from checkpoints import downloads
from controlplane.lib.api import Conflict

from ..checkpointing import open_job_storage
from ..profiling import traces_of
from ..validators import ProfileRequestValidator
from .base import JobScopedMixin
from .downloads import FILE_RESPONSES, DownloadView, StorageUnavailable, _storage_call

ProfileRequest = inline_serializer("ProfileRequest", {
    "attempt": serializers.IntegerField(), "request_id": serializers.CharField(),
    "steps": serializers.IntegerField(),
    "created": serializers.BooleanField(help_text="false: a pending request was returned"),
})

TraceListing = inline_serializer("ProfileTraceListing", {
    "traces": serializers.ListField(child=inline_serializer("ProfileTraceOut", {
        "id": serializers.IntegerField(), "attempt": serializers.IntegerField(),
        "request_id": serializers.CharField(), "rank": serializers.IntegerField(),
        "start_step": serializers.IntegerField(), "steps": serializers.IntegerField(),
        "path": serializers.CharField(), "bytes": serializers.IntegerField(),
        "created_at": serializers.DateTimeField(), "url": serializers.CharField(),
    })),
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
        attempt = job.running_attempt()
        if attempt is None:
            raise Conflict(f"Job {job.pk} is {job.phase}: only a running job can be profiled.")
        if job.heartbeats_missing:
            # It would stay pending for ever: directives ride on heartbeat replies.
            raise Conflict(f"Job {job.pk} runs a program that sends no heartbeats, so it never "
                           "gets the profile directive; report through the regatta SDK.")
        request_id, created = attempt.request_profile(body.validated_data["steps"],
                                                      actor_for(request.user))
        return Response({"attempt": attempt.pk, "request_id": request_id,
                         "steps": attempt.profile_steps, "created": created},
                        status=202 if created else 200)


class JobProfileListView(JobScopedMixin, APIView):
    """The job's profiler traces, newest profile first, one per rank."""

    @extend_schema(operation_id="job_profile_traces_list", responses=TraceListing)
    def get(self, request, pk):
        job = self.get_job()
        return Response({"traces": [{
            "id": t.pk, "attempt": t.attempt_id, "request_id": t.request_id, "rank": t.rank,
            "start_step": t.start_step, "steps": t.steps, "path": t.path, "bytes": t.bytes,
            "created_at": t.created_at,
            "url": request.build_absolute_uri(trace_url(job.pk, t.pk)),
        } for t in traces_of(job)]})


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
            opened = _storage_call(downloads.open_storage_file, storage, trace.path)
        except downloads.NotThere:
            raise NotFound(f"trace {trace.pk} is no longer in the job's storage.") from None
        name = f"job-{job.pk}-{trace.path.split('/')[1]}-{trace.path.rsplit('/', 1)[-1]}"
        return self.stream(opened, name)


def trace_url(job_id: int, trace_id: int) -> str:
    return reverse("jobs:job-profile-trace", args=[job_id, trace_id])
