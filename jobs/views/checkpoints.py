"""Checkpoints and exported models, scoped like their jobs."""

import django_filters
from rest_framework import generics

from accounts.permissions import IsPerson
from checkpoints.models import Checkpoint, ModelArtifact
from checkpoints.serializers import CheckpointSerializer, ModelArtifactSerializer
from controlplane.lib.filters import IdFilter
from controlplane.lib.keyset import KeysetPagination
from jobs.api.base import JobScopedMixin

from ..visibility import visible_jobs


class JobCheckpointListView(JobScopedMixin, generics.ListAPIView):
    """The job's checkpoints, newest step first (a step is unique per job)."""

    serializer_class = CheckpointSerializer
    pagination_class = KeysetPagination

    def get_queryset(self):
        return Checkpoint.objects.filter(job=self.get_job()).order_by("-step")


class CheckpointDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = CheckpointSerializer

    def get_queryset(self):
        return Checkpoint.objects.filter(job__in=visible_jobs(self.request.user).values("pk"))


class ArtifactFilter(django_filters.FilterSet):
    job = IdFilter(field_name="job_id")
    name = django_filters.CharFilter()

    class Meta:
        model = ModelArtifact
        fields = ["job", "name"]


class ArtifactListView(generics.ListAPIView):
    permission_classes = [IsPerson]
    serializer_class = ModelArtifactSerializer
    filterset_class = ArtifactFilter
    pagination_class = KeysetPagination

    def get_queryset(self):
        return ModelArtifact.objects.filter(
            job__in=visible_jobs(self.request.user).values("pk")
        ).order_by("-created_at", "-id")


class ArtifactDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = ModelArtifactSerializer

    def get_queryset(self):
        return ModelArtifact.objects.filter(job__in=visible_jobs(self.request.user).values("pk"))
