"""Cancel, checkpoint now, restart from a step (or rerun an ended job from
one): asks written beside the spec; the reconciler carries them out."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import actor_for
from controlplane.lib.api import Conflict
from controlplane.lib.tasks import enqueue_on_commit

from .. import services, tasks
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
    """A live job restarts its gang from the step; an ended one (succeeded,
    failed, cancelled) runs again from it as a new run, asked by its owner."""

    @extend_schema(request=RestartValidator,
                   responses={200: JobSerializer, 400: OpenApiResponse(),
                              403: OpenApiResponse(), 409: OpenApiResponse()})
    def post(self, request, pk):
        job = self.get_job()
        if job.is_terminal:
            return self._rerun(request, job)
        body = RestartValidator(data=request.data, context={"job": job})
        body.is_valid(raise_exception=True)
        job.request_restart(body.validated_data["from_step"], actor_for(request.user))
        enqueue_on_commit(tasks.reconcile_job, job.pk)
        return Response(JobSerializer(job, context={"request": request}).data)

    def _rerun(self, request, job):
        if not services.may_rerun(request.user, job):
            raise PermissionDenied("Only the job's owner or an operator may rerun an ended job.")
        if not services.can_resume(job):
            raise Conflict(f"Job {job.pk} has ended ({job.phase}) with no committed or verified "
                           "checkpoint to resume from; submit it again instead.")
        body = RestartValidator(data=request.data, context={"job": job})
        body.is_valid(raise_exception=True)
        services.rerun_job(job, body.validated_data["from_step"], request.user)
        return Response(JobSerializer(job, context={"request": request}).data)
