"""Output serializers: what the API shows. Input is checked in validators.py."""

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.admission import quota_usage
from jobs.recovery import budgets

from .models import (
    AttemptNode,
    FailureClass,
    JobAttempt,
    JobEvent,
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
