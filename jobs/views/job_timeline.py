from rest_framework import generics

from ..models import JobAttempt, JobEvent
from ..serializers import AttemptSerializer, JobEventSerializer
from .base import JobScopedMixin


class JobEventsView(JobScopedMixin, generics.ListAPIView):
    """The job's timeline, oldest first."""

    serializer_class = JobEventSerializer

    def get_queryset(self):
        return JobEvent.objects.filter(job=self.get_job()).order_by("created_at", "id")


class JobAttemptsView(JobScopedMixin, generics.ListAPIView):
    serializer_class = AttemptSerializer

    def get_queryset(self):
        return (
            JobAttempt.objects.filter(job=self.get_job())
            .prefetch_related("placements__node", "ranks")
            .order_by("number")
        )
