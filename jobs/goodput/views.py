from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import IsPerson
from jobs.api.base import JobScopedMixin
from jobs.goodput.models import GoodputEntry
from jobs.goodput.totals import goodput_totals
from jobs.visibility import visible_teams

GoodputReport = inline_serializer("GoodputReport", {
    "categories": serializers.DictField(child=serializers.DictField()),
    "total": serializers.DictField(),
    "goodput_ratio": serializers.FloatField(allow_null=True),
    "eval_runs": serializers.DictField(required=False),
})


class JobGoodputView(JobScopedMixin, APIView):
    """Where the job's GPU time went, summed per ledger category."""

    @extend_schema(responses=GoodputReport)
    def get(self, request, pk):
        job = self.get_job()
        # The job's eval runs book their GPU time on their own rows, as
        # `eval` (jobs/evals/): shown beside the job's, never in it.
        evals = goodput_totals(GoodputEntry.objects.filter(job__parent=job))["total"]
        return Response({"job": job.pk, **goodput_totals(GoodputEntry.objects.filter(job=job)),
                         "eval_runs": evals})


class TeamGoodputView(APIView):
    permission_classes = [IsPerson]

    @extend_schema(responses=GoodputReport)
    def get(self, request, name):
        team = get_object_or_404(visible_teams(request.user), name=name)
        entries = GoodputEntry.objects.filter(job__team=team)
        return Response({"team": team.name, **goodput_totals(entries)})
