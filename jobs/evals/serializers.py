"""An eval run as its parent job lists it."""

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import TrainingJob


class EvalRunSerializer(serializers.ModelSerializer):
    """One eval run as its parent lists it: the step, how it went, and
    what it reported (val_loss and friends, the generated samples)."""

    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True,
                                 default=None)
    url = serializers.SerializerMethodField()
    metrics = serializers.SerializerMethodField()
    samples = serializers.SerializerMethodField()
    attempts = serializers.IntegerField(source="attempt_count", read_only=True, default=0)

    class Meta:
        model = TrainingJob
        fields = ("id", "url", "eval_step", "phase", "pool", "world_size", "metrics", "samples",
                  "attempts", "pending_reason", "last_error", "created_at", "started_at",
                  "finished_at")
        read_only_fields = fields

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "number"}})
    def get_metrics(self, run) -> dict:
        return (run.eval_result or {}).get("metrics") or {}

    @extend_schema_field({"type": "array", "items": {"type": "object", "properties": {
        "prompt": {"type": "string"}, "completion": {"type": "string"}}}})
    def get_samples(self, run) -> list:
        return (run.eval_result or {}).get("samples") or []

    def get_url(self, run) -> str:
        path = reverse("jobs:job-detail", args=[run.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path
