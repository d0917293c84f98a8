import django_filters
from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response

from controlplane.lib.tasks import enqueue_on_commit

from .. import tasks
from ..models import Phase, TrainingJob
from ..permissions import IsPerson, actor_for, visible_jobs
from ..serializers import JobSerializer
from ..validators import JobSpecValidator


class JobFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    cluster = django_filters.CharFilter(field_name="cluster__name")
    phase = django_filters.ChoiceFilter(choices=Phase.choices)

    class Meta:
        model = TrainingJob
        fields = ["team", "cluster", "phase"]


class JobListView(generics.ListCreateAPIView):
    """List the jobs the caller may see (newest first), or submit one."""

    permission_classes = [IsPerson]
    serializer_class = JobSerializer
    filterset_class = JobFilter

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


def submit_job(spec: dict, user) -> TrainingJob:
    actor = actor_for(user)
    with transaction.atomic():
        job = TrainingJob.objects.create(created_by=user, **spec)
        if not job.storage_uri:
            job.storage_uri = str(settings.CHECKPOINT_ROOT / f"job-{job.pk}")
            TrainingJob.objects.filter(pk=job.pk).update(storage_uri=job.storage_uri)
        job.record("Submitted", f"submitted by {actor}", actor=actor,
                   evidence={"world_size": job.world_size, "pool": job.pool.name})
        enqueue_on_commit(tasks.reconcile_job, job.pk)
    return job
