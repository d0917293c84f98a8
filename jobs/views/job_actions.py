"""Cancel, checkpoint now, restart from a step (or rerun an ended job from
one): asks written beside the spec; the reconciler carries them out."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.base import JobScopedMixin

from .. import services
from ..serializers import JobSerializer
from ..validators import RestartValidator


class JobCancelView(JobScopedMixin, APIView):
    """Idempotent: a repeated cancel is 200 and writes nothing; 409 for a job
    that already succeeded or failed."""

    @extend_schema(request=None, responses={200: JobSerializer, 409: OpenApiResponse()})
    def post(self, request, pk):
        job = self.get_job()
        services.cancel(job, request.user)
        return Response(JobSerializer(job, context={"request": request}).data)


class JobCheckpointView(JobScopedMixin, APIView):
    @extend_schema(
        request=None,
        responses={202: inline_serializer("CheckpointRequest", {
            "attempt": serializers.IntegerField(), "request_id": serializers.CharField()}),
            409: OpenApiResponse()},
    )
    def post(self, request, pk):
        attempt, request_id = services.checkpoint_now(self.get_job(), request.user)
        return Response({"attempt": attempt.pk, "request_id": request_id}, status=202)


class JobRestartView(JobScopedMixin, APIView):
    """A live job restarts its gang from the step; an ended one (succeeded,
    failed, cancelled) runs again from it as a new run, asked by its owner."""

    @extend_schema(request=RestartValidator,
                   responses={200: JobSerializer, 400: OpenApiResponse(),
                              403: OpenApiResponse(description="An ended job is rerun only at "
                                                               "its owner's or an operator's "
                                                               "word."),
                              409: OpenApiResponse(description="No committed or verified "
                                                               "checkpoint at the step (or its "
                                                               "folder is a symbolic link), or "
                                                               "an ended job with none to "
                                                               "rerun from.")})
    def post(self, request, pk):
        job = self.get_job()
        # The owner's word and a checkpoint to rerun from come before the step.
        services.check_may_restart(job, request.user)
        body = RestartValidator(data=request.data, context={"job": job})
        body.is_valid(raise_exception=True)
        services.restart(job, body.validated_data["from_step"], request.user)
        return Response(JobSerializer(job, context={"request": request}).data)
