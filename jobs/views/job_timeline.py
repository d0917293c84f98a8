from rest_framework import generics

from controlplane.lib.keyset import KeysetPagination
from jobs.api.base import JobScopedMixin

from ..models import JobAttempt, JobEvent
from ..serializers import AttemptSerializer, JobEventSerializer


class JobEventsView(JobScopedMixin, generics.ListAPIView):
    """The job's timeline, oldest first."""

    serializer_class = JobEventSerializer
    pagination_class = KeysetPagination

    def get_queryset(self):
        return JobEvent.objects.filter(job=self.get_job()).order_by("created_at", "id")


class JobAttemptsView(JobScopedMixin, generics.ListAPIView):
    serializer_class = AttemptSerializer
    pagination_class = KeysetPagination

    def get_queryset(self):
        return (
            JobAttempt.objects.filter(job=self.get_job())
            .prefetch_related("placements__node", "ranks")
            .order_by("number")
        )
