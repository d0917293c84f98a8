"""Input validators (requests in), kept apart from the output serializers.

Every validator is strict: unknown fields are named and refused, numbers must
be JSON numbers (not "2", not true), and a spec that could never be placed is
refused before anything is written.
"""

import math
import re

from django.db.models import Q
from rest_framework import serializers

from checkpoints.models import Checkpoint
from clusters.models import Cluster, NodePool

from .models import DEFAULT_RESTART_BUDGETS, FailureClass, Quota, Team, TrainingJob
from .permissions import is_operator

try:  # The trainer package is optional on a control-plane-only install.
    from trainer.config import ConfigError, TrainerConfig
except ImportError:  # pragma: no cover - exercised only without the trainer
    TrainerConfig = None
    ConfigError = ValueError


class StrictIntegerField(serializers.IntegerField):
    """DRF's IntegerField takes "2" and true; a spec must say 2."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        return super().to_internal_value(int(data))


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Expected a JSON object."]}
            )
        # Named alongside any other field errors, so one reply lists every problem.
        unknown = {name: ["Unknown field."] for name in sorted(set(data) - set(self.fields))}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({**exc.detail, **unknown}) from None
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


_S3_OR_FILE = re.compile(r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?|file:///.*|/.*)$")
BUDGET_KEYS = tuple(FailureClass.values)


class JobSpecValidator(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=100)
    team = StrictCharField(required=False, max_length=63)
    cluster = StrictCharField(max_length=63)
    pool = StrictCharField(required=False, max_length=63)
    num_nodes = StrictIntegerField(min_value=1, max_value=1024)
    gpus_per_node = StrictIntegerField(min_value=1, max_value=64)
    world_size = StrictIntegerField(required=False, min_value=1, max_value=65536)
    strategy = serializers.ChoiceField(choices=TrainingJob.Strategy.choices, required=False)
    image = StrictCharField(required=False, max_length=300)
    entrypoint = serializers.ListField(
        child=StrictCharField(max_length=1000, allow_blank=True), required=False, max_length=256
    )
    hyperparameters = serializers.DictField(required=False)
    checkpoint_policy = serializers.ChoiceField(
        choices=TrainingJob.CheckpointPolicy.choices, required=False
    )
    checkpoint_every_steps = StrictIntegerField(required=False, min_value=1, max_value=1_000_000)
    keep_last = StrictIntegerField(required=False, min_value=1, max_value=100)
    restart_budgets = serializers.DictField(required=False)
    priority = StrictIntegerField(required=False, min_value=-1000, max_value=1000)
    spot_allowed = StrictBooleanField(required=False)
    storage_uri = StrictCharField(required=False, max_length=1000)

    def validate_strategy(self, value):
        if not isinstance(self.initial_data.get("strategy"), str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate_checkpoint_policy(self, value):
        if not isinstance(self.initial_data.get("checkpoint_policy"), str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate_restart_budgets(self, value):
        unknown = sorted(set(value) - set(BUDGET_KEYS))
        if unknown:
            raise serializers.ValidationError(
                f"Unknown failure classes: {', '.join(unknown)} (known: {', '.join(BUDGET_KEYS)})."
            )
        for key, budget in value.items():
            if isinstance(budget, bool) or not isinstance(budget, int) or not 0 <= budget <= 100:
                raise serializers.ValidationError(f"{key}: must be an integer from 0 to 100.")
        return {**DEFAULT_RESTART_BUDGETS, **value}

    def validate_storage_uri(self, value):
        if value and not _S3_OR_FILE.match(value):
            raise serializers.ValidationError(
                "Must be an absolute path, a file:/// URI or an s3://bucket/prefix URI."
            )
        return value

    def validate_team(self, value):
        team = Team.objects.filter(name=value).first()
        user = self.context["request"].user
        if team is None or not (is_operator(user) or team.members.filter(pk=user.pk).exists()):
            raise serializers.ValidationError(f"You are not a member of a team named {value!r}.")
        return team

    def validate_cluster(self, value):
        cluster = Cluster.objects.filter(name=value).first()
        if cluster is None:
            raise serializers.ValidationError(f"unknown cluster {value!r}")
        return cluster

    def validate(self, attrs):
        attrs = super().validate(attrs)
        errors = {}
        if "team" not in attrs:
            user = self.context["request"].user
            teams = list(Team.objects.filter(members=user)[:2])
            if len(teams) != 1:
                errors["team"] = [
                    "Required: you belong to several teams." if teams
                    else "Required: you belong to no team."
                ]
            else:
                attrs["team"] = teams[0]
        cluster = attrs["cluster"]
        pools = NodePool.objects.filter(cluster=cluster)
        pool = pools.filter(name=attrs["pool"]).first() if "pool" in attrs else pools.first()
        if pool is None:
            errors["pool"] = [
                f"unknown pool {attrs['pool']!r} on cluster {cluster.name}" if "pool" in attrs
                else f"cluster {cluster.name} has no node pools"
            ]
            raise serializers.ValidationError(errors)
        attrs["pool"] = pool
        nodes, gpus = attrs["num_nodes"], attrs["gpus_per_node"]
        if gpus > pool.gpus_per_node:
            errors["gpus_per_node"] = [
                f"{gpus} GPUs per node, but nodes of pool {pool.name} have {pool.gpus_per_node}."
            ]
        if nodes > pool.size:
            errors["num_nodes"] = [
                f"{nodes} nodes, but pool {pool.name} has only {pool.size}; "
                "it could never be placed."
            ]
        if "world_size" in attrs and attrs["world_size"] != nodes * gpus:
            errors["world_size"] = [
                f"world_size {attrs['world_size']} must equal num_nodes × gpus_per_node "
                f"= {nodes} × {gpus} = {nodes * gpus}."
            ]
        hyper = attrs.get("hyperparameters")
        if hyper is not None and TrainerConfig is not None:
            try:
                TrainerConfig.from_dict(hyper)
            except ConfigError as exc:
                errors["hyperparameters"] = [str(exc)]
        if errors:
            raise serializers.ValidationError(errors)
        attrs.pop("world_size", None)
        return attrs


class RestartValidator(StrictSerializer):
    from_step = StrictIntegerField(min_value=0)

    def validate_from_step(self, value):
        job = self.context["job"]
        ok = Checkpoint.objects.filter(
            job=job, step=value, state__in=Checkpoint.LOADABLE
        ).exists()
        if not ok:
            raise serializers.ValidationError(
                f"Job {job.pk} has no committed or verified checkpoint at step {value}."
            )
        return value


class ReasonValidator(StrictSerializer):
    reason = StrictCharField(required=False, max_length=250, allow_blank=True)


class FaultValidator(StrictSerializer):
    kind = serializers.ChoiceField(choices=[])

    def __init__(self, *args, **kwargs):
        from clusters.providers.base import FaultKind

        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = list(FaultKind.ALL)


class TokenValidator(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=100)


class QuotaValidator(StrictSerializer):
    team = StrictCharField(max_length=63)
    cluster = StrictCharField(max_length=63)
    gpus = StrictIntegerField(min_value=0, max_value=1_000_000)
    max_running_jobs = StrictIntegerField(required=False, min_value=0, max_value=100_000)
    priority_weight = StrictIntegerField(required=False, min_value=0, max_value=1000)
    can_borrow = StrictBooleanField(required=False)

    def validate_team(self, value):
        team = Team.objects.filter(name=value).first()
        if team is None:
            raise serializers.ValidationError(f"unknown team {value!r}")
        return team

    def validate_cluster(self, value):
        cluster = Cluster.objects.filter(name=value).first()
        if cluster is None:
            raise serializers.ValidationError(f"unknown cluster {value!r}")
        return cluster

    def validate(self, attrs):
        attrs = super().validate(attrs)
        team = attrs.get("team", getattr(self.instance, "team", None))
        cluster = attrs.get("cluster", getattr(self.instance, "cluster", None))
        if team is not None and cluster is not None:
            clash = Quota.objects.filter(Q(team=team) & Q(cluster=cluster))
            if self.instance is not None:
                clash = clash.exclude(pk=self.instance.pk)
            if clash.exists():
                raise serializers.ValidationError(
                    {"team": ["This team already has a quota on this cluster."]}
                )
        return attrs


def finite_number(value) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
