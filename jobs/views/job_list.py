import django_filters
from django.db.models import Subquery
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from accounts.permissions import IsPerson
from clusters.models import Cluster
from controlplane.lib.filters import IdFilter
from controlplane.lib.keyset import KeysetPagination

from ..models import Phase, Team, TrainingJob
from ..serializers import JobSerializer
from ..services import submit_job
from ..validators import JobSpecValidator
from ..visibility import visible_jobs


def _by_name(model, column: str):
    """Filter on a foreign key by the other row's name, as a scalar subquery:
    PostgreSQL then walks the (column, created_at, id) index in page order
    rather than joining and sorting every matching job."""
    def method(queryset, name, value):
        return queryset.filter(**{column: Subquery(model.objects.filter(name=value)
                                                   .values("pk")[:1])})
    return method


class JobFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(method=_by_name(Team, "team_id"))
    cluster = django_filters.CharFilter(method=_by_name(Cluster, "cluster_id"))
    phase = django_filters.ChoiceFilter(choices=Phase.choices)
    kind = django_filters.ChoiceFilter(choices=TrainingJob.Kind.choices)
    parent = IdFilter(field_name="parent_id")

    class Meta:
        model = TrainingJob
        fields = ["team", "cluster", "phase", "kind", "parent"]


class JobListView(generics.ListCreateAPIView):
    """List the jobs the caller may see (newest first), or submit one."""

    permission_classes = [IsPerson]
    serializer_class = JobSerializer
    filterset_class = JobFilter
    pagination_class = KeysetPagination

    def get_queryset(self):
        return visible_jobs(self.request.user).select_related("created_by").order_by(
            "-created_at", "-id"
        )

    @extend_schema(request=JobSpecValidator, responses={201: JobSerializer})
    def post(self, request, *args, **kwargs):
        spec = JobSpecValidator(data=request.data, context={"request": request})
        spec.is_valid(raise_exception=True)
        job = submit_job(spec.validated_data, request.user)
        return Response(JobSerializer(job, context={"request": request}).data,
                        status=status.HTTP_201_CREATED)
