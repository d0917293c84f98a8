"""The traces of an on-demand profile.

Models of the `jobs` app that belong to this feature; jobs/models.py
imports them so that Django finds them with the app's models."""

from django.db import models
from django.utils import timezone


class ProfileTrace(models.Model):
    """One rank's `torch.profiler` trace of an on-demand profile: a gzipped
    Chrome trace at `path` in the job's storage, beside its checkpoints."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE,
                            related_name="profile_traces")
    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE,
                                related_name="profile_traces")
    request_id = models.CharField(max_length=64)
    start_step = models.PositiveIntegerField()
    steps = models.PositiveSmallIntegerField()
    rank = models.PositiveIntegerField()
    path = models.CharField(max_length=300)  # relative to the job's storage URI
    bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "request_id", "rank"]
        constraints = [
            # A retried report stores nothing twice.
            models.UniqueConstraint(fields=["attempt", "request_id", "rank"],
                                    name="uniq_profile_trace")
        ]

    @property
    def end_step(self) -> int:
        return self.start_step + self.steps - 1
