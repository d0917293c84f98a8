"""Cancel, checkpoint now, restart from a step: asks written beside the spec;
the reconciler carries them out."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import actor_for
from controlplane.lib.api import Conflict
from controlplane.lib.tasks import enqueue_on_commit

from .. import tasks
from ..serializers import JobSerializer
from ..validators import RestartValidator
from .base import JobScopedMixin


class JobCancelView(JobScopedMixin, APIView):
    """Idempotent: a repeated cancel is 200 and writes nothing; 409 for a job
    that already succeeded or failed."""

    @extend_schema(request=None, responses={200: JobSerializer, 409: OpenApiResponse()})
    def post(self, request, pk):
        job = self.get_job()
        if job.request_cancel(actor_for(request.user)):
            enqueue_on_commit(tasks.reconcile_job, job.pk)
        return Response(JobSerializer(job, context={"request": request}).data)


class JobCheckpointView(JobScopedMixin, APIView):
    @extend_schema(
        request=None,
        responses={202: inline_serializer("CheckpointRequest", {
            "attempt": serializers.IntegerField(), "request_id": serializers.CharField()}),
            409: OpenApiResponse()},
    )
    def post(self, request, pk):
        job = self.get_job()
        attempt = job.running_attempt()
        if attempt is None:
            raise Conflict(f"Job {job.pk} has no running attempt to checkpoint.")
        request_id = attempt.request_checkpoint(actor_for(request.user))
        return Response({"attempt": attempt.pk, "request_id": request_id}, status=202)


class JobRestartView(JobScopedMixin, APIView):
    @extend_schema(request=RestartValidator, responses={200: JobSerializer, 409: OpenApiResponse()})
    def post(self, request, pk):
        job = self.get_job()
        if job.is_terminal:
            raise Conflict(f"Job {job.pk} has ended ({job.phase}); submit a new one.")
        body = RestartValidator(data=request.data, context={"job": job})
        body.is_valid(raise_exception=True)
        job.request_restart(body.validated_data["from_step"], actor_for(request.user))
        enqueue_on_commit(tasks.reconcile_job, job.pk)
        return Response(JobSerializer(job, context={"request": request}).data)
