"""Run comparison (jobs/metrics/compare.py) and a job's metrics as a TensorBoard
event file (jobs/metrics/tensorboard.py).

Scoped like every job endpoint: a job the caller may not see is 404."""

from django.core.validators import RegexValidator
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsPerson
from controlplane.lib.validation import StrictCharField
from jobs.api.base import JobScopedMixin
from jobs.api.downloads import DownloadView
from jobs.metrics import compare, tensorboard
from jobs.metrics.series import DEFAULT_POINTS, MAX_POINTS


class CompareQuery(serializers.Serializer):
    metric = StrictCharField(max_length=64, required=False,
                             help_text="default: loss, or the first name")
    x = serializers.ChoiceField(choices=compare.X_AXES, default="step")
    points = serializers.IntegerField(min_value=2, max_value=MAX_POINTS, default=DEFAULT_POINTS,
                                      help_text=f"per job, at most {MAX_POINTS}")


class CompareParameters(CompareQuery):
    """The query as the schema states it: `jobs` is read apart, since it may
    also come as repeated values (compare.parse_job_ids)."""

    jobs = StrictCharField(validators=[RegexValidator(compare.JOB_IDS_PATTERN)],
                           help_text=f"job ids, comma-separated; at most {compare.MAX_JOBS}")


def comparison_from(user, query) -> compare.Comparison:
    """The comparison a query asks for: 400 naming the field for bad input,
    404 for a job the caller may not see. Shared with the console's page."""
    try:
        ids = compare.parse_job_ids(query.getlist("jobs"))
    except ValueError as exc:
        raise ValidationError({"jobs": [str(exc)]}) from None
    params = CompareQuery(data=query)
    params.is_valid(raise_exception=True)
    try:
        jobs = compare.scoped_jobs(user, ids)
    except compare.JobsNotFound as exc:
        raise NotFound(str(exc)) from None
    metric = params.validated_data.get("metric") or compare.default_metric(
        compare.metric_names(jobs))
    return compare.Comparison(jobs, metric, params.validated_data["x"],
                              params.validated_data["points"])


Curve = inline_serializer("ComparedJob", {
    "id": serializers.IntegerField(), "name": serializers.CharField(),
    "team": serializers.CharField(), "phase": serializers.CharField(),
    "current_step": serializers.IntegerField(),
    "total": serializers.IntegerField(help_text="points the whole series holds"),
    "x": serializers.ListField(child=serializers.FloatField(),
                               help_text="steps, or seconds since the series' first point"),
    "y": serializers.ListField(child=serializers.FloatField()),
    "steps": serializers.ListField(child=serializers.IntegerField()),
    "last": inline_serializer("LastPoint", {"step": serializers.IntegerField(),
                                            "value": serializers.FloatField()},
                              allow_null=True),
})
ParamRow = inline_serializer("ComparedParam", {
    "key": serializers.CharField(help_text="hyperparameters.<dotted key> or spec.<field>"),
    "values": serializers.ListField(child=serializers.JSONField(allow_null=True),
                                    help_text="one per job, in the order asked; null: absent"),
    "differs": serializers.BooleanField(),
})


class CompareView(APIView):
    """Several jobs' curves of one metric, downsampled like the job page's,
    and their hyperparameters and spec side by side with the differing keys
    marked."""

    permission_classes = [IsPerson]

    @extend_schema(
        operation_id="jobs_compare",
        parameters=[CompareParameters],
        responses={200: inline_serializer("Comparison", {
            "metric": serializers.CharField(), "x": serializers.CharField(),
            "metrics": serializers.ListField(child=serializers.CharField(),
                                             help_text="every metric any of the jobs reported"),
            "jobs": serializers.ListField(child=Curve),
            "params": serializers.ListField(child=ParamRow),
        }), 400: OpenApiResponse(), 404: OpenApiResponse()},
    )
    def get(self, request):
        return Response(comparison_from(request.user, request.query_params).as_dict())


class JobTensorBoardView(JobScopedMixin, DownloadView):
    """Every metric point of the job as one TensorBoard event file, streamed
    as it is made; put it in a folder and run `tensorboard --logdir` on it."""

    @extend_schema(operation_id="job_metrics_tensorboard", responses={
        (200, "application/octet-stream"): OpenApiResponse(
            OpenApiTypes.BINARY, description="a TensorBoard event file (tfevents)"),
        404: OpenApiResponse(description="no such job, or not yours"),
    })
    def get(self, request, pk):
        job = self.get_job()
        response = StreamingHttpResponse(tensorboard.events(job),
                                         content_type="application/octet-stream")
        response["Content-Disposition"] = (
            f'attachment; filename="{tensorboard.file_name(job)}"')
        response["X-Content-Type-Options"] = "nosniff"
        return response
