"""The goodput ledger's lines.

Models of the `jobs` app that belong to this feature; jobs/models.py
imports them so that Django finds them with the app's models."""

from django.db import models
from django.utils import timezone


class GoodputEntry(models.Model):
    """One line of the goodput ledger: where a span of GPU time went."""

    class Category(models.TextChoices):
        PRODUCTIVE = "productive", "Productive training"
        ROLLBACK = "rollback", "Work lost to rollback"
        RESTART = "restart", "Restart latency"
        # A start that followed no failure (the job's first, or one after a
        # trip back to the queue): the GPUs held from admission to the first
        # step. Kept apart from restart latency, which only a restart costs.
        STARTUP = "startup", "Start-up"
        CHECKPOINT = "checkpoint", "Checkpoint stalls"
        HANG = "hang", "Hang before detection"
        QUEUED = "queued", "Queueing"
        # Work a preempted gang lost because it could not checkpoint in time.
        PREEMPTION = "preemption", "Work lost to preemption"
        # An eval run's GPU time, whatever it was spent on: kept apart from
        # training's productive and lost time (jobs/evals/).
        EVAL = "eval", "Evaluation runs"

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="goodput")
    attempt = models.ForeignKey("jobs.JobAttempt", null=True, blank=True,
                                on_delete=models.SET_NULL, related_name="goodput")
    category = models.CharField(max_length=12, choices=Category.choices)
    seconds = models.FloatField()
    gpu_seconds = models.FloatField()
    detail = models.CharField(max_length=300, blank=True)
    # Keeps a re-run reconcile from booking the same span twice.
    key = models.CharField(max_length=120)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="uniq_goodput_key")
        ]
