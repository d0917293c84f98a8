"""Output serializers: what the API shows. Input is checked in validators.py."""

from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.admission import quota_usage
from jobs.recovery import budgets

from .models import (
    AttemptNode,
    FailureClass,
    GoodputEntry,
    JobAttempt,
    JobEvent,
    ProfileTrace,
    Quota,
    RankStatus,
    Team,
    TrainingJob,
)

SPEC_FIELDS = (
    "name", "image", "entrypoint", "args", "env", "completion", "num_nodes", "gpus_per_node",
    "strategy", "hyperparameters",
    "checkpoint_policy", "checkpoint_every_steps", "keep_last", "restart_budgets",
    "budget_reset_steps", "budget_reset_minutes", "priority",
    "spot_allowed", "storage_uri", "cancel_requested_at", "restart_from_step", "generation",
    "kind", "eval", "parent", "eval_step",
)
STATUS_FIELDS = (
    "phase", "pending_reason", "conditions", "current_step", "progress", "last_error",
    "restart_counts", "budget_spent", "restarts", "checkpoint_interval_steps",
    "checkpoint_interval_inputs",
    "observed_generation", "created_at", "admitted_at", "started_at", "finished_at",
    "borrowed_gpus", "borrowed_from", "preempted_at", "eval_result",
)


class JobSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True,
                                 default=None)
    created_by = serializers.CharField(source="created_by.username", read_only=True,
                                       allow_null=True, default=None)
    world_size = serializers.IntegerField(read_only=True)
    url = serializers.SerializerMethodField()
    restarts = serializers.SerializerMethodField()
    # The spec's eval block as it was given (jobs/evals/); an eval run's
    # parent job and the checkpoint step it evaluates.
    eval = serializers.JSONField(source="eval_policy", read_only=True)
    parent = serializers.IntegerField(source="parent_id", read_only=True, allow_null=True)

    class Meta:
        model = TrainingJob
        fields = ("id", "url", "team", "cluster", "pool", "created_by", "world_size",
                  *SPEC_FIELDS, *STATUS_FIELDS)
        read_only_fields = fields

    @extend_schema_field({"type": "object", "additionalProperties": {
        "type": "object", "properties": {"spent": {"type": "integer"},
                                         "budget": {"type": "integer"},
                                         "in_all": {"type": "integer"}}}})
    def get_restarts(self, job) -> dict:
        """Per class: restarts charged to the job within the window, its
        budget, and every restart of this run, forgiven ones too."""
        return budgets.summary(job, timezone.now())

    def get_url(self, job) -> str:
        path = reverse("jobs:job-detail", args=[job.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path


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


class JobEventSerializer(serializers.ModelSerializer):
    attempt = serializers.IntegerField(source="attempt_id", read_only=True, allow_null=True)

    class Meta:
        model = JobEvent
        fields = ("id", "kind", "message", "actor", "evidence", "from_phase", "to_phase",
                  "attempt", "created_at")
        read_only_fields = fields


class AttemptNodeSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    node_id = serializers.IntegerField(read_only=True)
    node_state = serializers.CharField(source="node.state", read_only=True)

    class Meta:
        model = AttemptNode
        fields = ("node_id", "node", "node_rank", "node_state")
        read_only_fields = fields


class RankStatusSerializer(serializers.ModelSerializer):
    class Meta:
        model = RankStatus
        fields = ("rank", "node_name", "step", "samples_per_s", "tokens_per_s", "step_time_s",
                  "gpu", "last_heartbeat_at")
        read_only_fields = fields


class BlankAsNullChoiceField(serializers.ChoiceField):
    """A choice column stored blank until set (an attempt's failure class
    while it runs) is null in the API: "" is not one of the choices."""

    def to_representation(self, value):
        return None if value in ("", None) else super().to_representation(value)


class AttemptSerializer(serializers.ModelSerializer):
    nodes = AttemptNodeSerializer(source="placements", many=True, read_only=True)
    failure_class = BlankAsNullChoiceField(choices=FailureClass.choices, allow_null=True,
                                           read_only=True)
    ranks = RankStatusSerializer(many=True, read_only=True)
    resumed_from_step = serializers.IntegerField(source="resume_step", read_only=True,
                                                 allow_null=True)
    resumed_from_checkpoint = serializers.IntegerField(source="resumed_from_id", read_only=True,
                                                       allow_null=True)

    class Meta:
        model = JobAttempt
        fields = ("id", "number", "state", "nodes", "ranks", "resumed_from_step",
                  "resumed_from_checkpoint", "preflight", "placement", "created_at", "started_at",
                  "first_step_at", "ended_at", "exit_code", "failure_class", "failure_reason",
                  "last_heartbeat_at", "last_step", "checkpoint_request_id",
                  "checkpoint_requested_at", "stop_requested_at")
        read_only_fields = fields


class UsageSerializer(serializers.Serializer):
    gpus_used = serializers.IntegerField()
    gpus_limit = serializers.IntegerField()
    gpus_free = serializers.IntegerField()
    gpus_borrowed = serializers.IntegerField()
    gpus_lent = serializers.IntegerField()
    running_jobs = serializers.IntegerField()
    running_jobs_limit = serializers.IntegerField()


class QuotaSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    usage = serializers.SerializerMethodField()

    class Meta:
        model = Quota
        fields = ("id", "team", "cluster", "gpus", "max_running_jobs", "priority_weight",
                  "can_borrow", "usage")
        read_only_fields = fields

    def get_usage(self, quota) -> UsageSerializer:
        # Lists hand in every row's usage at once (views/quotas.py, teams.py).
        usage = self.context.get("quota_usage") or quota_usage([quota])
        return usage[quota.pk]


class TeamSerializer(serializers.ModelSerializer):
    quotas = QuotaSerializer(many=True, read_only=True)
    members = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ("id", "name", "display_name", "members", "quotas", "created_at")
        read_only_fields = fields

    def get_members(self, team) -> list[str]:
        return sorted(u.username for u in team.members.all())


def goodput_totals(entries) -> dict:
    """Sum a GoodputEntry queryset per category; every category appears."""
    totals = {c: {"seconds": 0.0, "gpu_seconds": 0.0} for c in GoodputEntry.Category.values}
    rows = entries.values("category").annotate(s=Sum("seconds"), g=Sum("gpu_seconds"))
    for row in rows:
        totals[row["category"]] = {"seconds": row["s"] or 0.0, "gpu_seconds": row["g"] or 0.0}
    total_gpu = sum(v["gpu_seconds"] for v in totals.values())
    productive = totals[GoodputEntry.Category.PRODUCTIVE]["gpu_seconds"]
    # Evaluation runs' GPU time is in the totals but not in training's
    # ratio: it is neither productive training nor training lost.
    training_gpu = total_gpu - totals[GoodputEntry.Category.EVAL]["gpu_seconds"]
    return {
        "categories": totals,
        "total": {
            "seconds": sum(v["seconds"] for v in totals.values()),
            "gpu_seconds": total_gpu,
        },
        "goodput_ratio": (productive / training_gpu) if training_gpu else None,
    }


class ProfileTraceSerializer(serializers.ModelSerializer):
    """One rank's profiler trace; `url` downloads it (gzipped Chrome JSON)."""

    url = serializers.SerializerMethodField()

    class Meta:
        model = ProfileTrace
        fields = ("id", "attempt", "request_id", "rank", "start_step", "steps", "path", "bytes",
                  "created_at", "url")

    def get_url(self, obj) -> str:
        path = reverse("jobs:job-profile-trace", args=[obj.job_id, obj.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path
