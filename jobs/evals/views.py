"""A job's eval runs (jobs/evals/), scoped like the job itself."""

from django.db.models import Count
from rest_framework import generics

from jobs.api.base import JobScopedMixin
from jobs.evals.serializers import EvalRunSerializer
from jobs.models import TrainingJob


class JobEvalsView(JobScopedMixin, generics.ListAPIView):
    """The job's eval runs, by checkpoint step: phase, metrics, samples.
    Not paginated: a job has one run per evaluated checkpoint, and its
    retention keeps only a few checkpoints' worth live."""

    serializer_class = EvalRunSerializer
    pagination_class = None

    def get_queryset(self):
        return (TrainingJob.objects.filter(parent=self.get_job()).select_related("pool")
                .annotate(attempt_count=Count("attempts")).order_by("eval_step"))
