from django.db import models
from django.utils import timezone


class Checkpoint(models.Model):
    class State(models.TextChoices):
        WRITING = "writing"
        COMMITTED = "committed"  # the trainer wrote the manifest and marker
        VERIFIED = "verified"  # the control plane re-read it and the checksums match
        CORRUPT = "corrupt"
        # On the branch a person's restart from an earlier step left: never
        # resumed from nor offered, pruned like a corrupt one.
        ABANDONED = "abandoned"
        DELETED = "deleted"

    LOADABLE = (State.COMMITTED, State.VERIFIED)

    job = models.ForeignKey(
        "jobs.TrainingJob", on_delete=models.CASCADE, related_name="checkpoints"
    )
    attempt = models.ForeignKey(
        "jobs.JobAttempt", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="checkpoints",
    )
    step = models.PositiveIntegerField()
    uri = models.CharField(max_length=1000)
    bytes = models.BigIntegerField(default=0)
    manifest_sha256 = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.COMMITTED)
    state_reason = models.CharField(max_length=300, blank=True)
    save_seconds = models.FloatField(default=0.0)
    blocking_seconds = models.FloatField(default=0.0)
    emergency = models.BooleanField(default=False)
    request_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="uniq_checkpoint_step_per_job")
        ]

    def __str__(self):
        return f"{self.job_id}@{self.step}"


class ModelArtifact(models.Model):
    """The exported final model: consolidated weights and config in the registry."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="artifacts")
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="artifacts"
    )
    name = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    uri = models.CharField(max_length=1000)
    bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    # torch (a consolidated model.pt), dcp (a DCP checkpoint kept whole) or
    # files (whatever the job's program saved); checkpoints/export.py.
    format = models.CharField(max_length=32, default="torch")
    config = models.JSONField(default=dict, blank=True)
    # Every file of the artifact: {path: {"sha256", "bytes"}}, as downloads list them.
    files = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="uniq_artifact_version")
        ]
