from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.lib.validation import StrictCharField
from jobs.api.base import JobScopedMixin
from jobs.metrics.laid_in import EVAL_RESULTS
from jobs.metrics.models import MetricName
from jobs.metrics.series import DEFAULT_POINTS, MAX_POINTS, series


class SeriesQuery(serializers.Serializer):
    name = StrictCharField(max_length=64, help_text="a metric the job reported, e.g. loss")
    points = serializers.IntegerField(min_value=2, max_value=MAX_POINTS, default=DEFAULT_POINTS,
                                      help_text=f"at most {MAX_POINTS}")


class JobMetricsView(JobScopedMixin, APIView):
    """One metric as [[step, value], ...], downsampled (LTTB) to `points`."""

    @extend_schema(
        parameters=[SeriesQuery],
        responses=inline_serializer("MetricSeries", {
            "name": serializers.CharField(), "total": serializers.IntegerField(),
            "points": serializers.ListField(child=serializers.ListField())}),
    )
    def get(self, request, pk):
        job = self.get_job()
        query = SeriesQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(series(job.pk, query.validated_data["name"],
                               query.validated_data["points"]))


class JobMetricNamesView(JobScopedMixin, APIView):
    @extend_schema(responses=inline_serializer("MetricNames", {
        "names": serializers.ListField(child=serializers.CharField())}))
    def get(self, request, pk):
        job = self.get_job()
        # One row per metric, kept on ingest (jobs/metrics/ingest.py): no DISTINCT
        # over the job's million points.
        names = set(MetricName.objects.filter(job=job).values_list("name", flat=True))
        # What its eval runs reported is on its chart too (jobs/metrics/series.py).
        names |= EVAL_RESULTS.names(job.pk)
        return Response({"names": sorted(names)})
