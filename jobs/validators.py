"""Input validators (requests in), kept apart from the output serializers.

Every validator is strict: unknown fields are named and refused, numbers must
be JSON numbers (not "2", not true), and a spec that could never be placed is
refused before anything is written.
"""

import json
import re

from django.db.models import Q
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

from accounts.permissions import acts_for_team
from checkpoints import confinement
from clusters.models import Cluster, NodePool
from controlplane.lib.validation import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)

from . import isolation
from .models import DEFAULT_RESTART_BUDGETS, FailureClass, Quota, Team, TrainingJob

try:  # The trainer package is optional on a control-plane-only install.
    from trainer.config import ConfigError, TrainerConfig
except ImportError:  # pragma: no cover - exercised only without the trainer
    TrainerConfig = None
    ConfigError = ValueError


def cluster_named(name: str) -> Cluster:
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise serializers.ValidationError(f"unknown cluster {name!r}")
    return cluster


BUDGET_KEYS = tuple(FailureClass.values)
MAX_BUDGET = 100
# Set here, before the spec validator names them in its fields.
MAX_ENV_VARS = 256
MAX_ENV_VALUE = 32_768


@extend_schema_field({
    "type": "object", "additionalProperties": False,
    "description": "restarts allowed per failure class; the classes not given keep their "
                   "defaults",
    "properties": {key: {"type": "integer", "minimum": 0, "maximum": MAX_BUDGET}
                   for key in BUDGET_KEYS}})
class RestartBudgetsField(serializers.DictField):
    pass


@extend_schema_field({
    "type": "object", "maxProperties": MAX_ENV_VARS,
    "description": "the ranks' variables: names from docs/byo.md's table (\"The environment "
                   "a job may set\") or the cluster's env_allow setting",
    "additionalProperties": {"type": "string", "maxLength": MAX_ENV_VALUE,
                             "pattern": "^[^\\x00]*$"}})
class EnvField(serializers.DictField):
    pass


class EvalSpecValidator(StrictSerializer):
    """The spec's `eval` block (jobs/evals/, docs/evaluation.md): which
    checkpoints get an eval run, where it runs, and what it runs."""

    every_n_checkpoints = StrictIntegerField(required=False, min_value=1, max_value=10_000)
    every_checkpoint = StrictBooleanField(required=False)
    pool = StrictCharField(max_length=63)
    nodes = StrictIntegerField(required=False, min_value=1, max_value=64)
    gpus_per_node = StrictIntegerField(required=False, min_value=1, max_value=64)
    entrypoint = serializers.ListField(
        child=StrictCharField(max_length=1000, allow_blank=True), required=False, max_length=256
    )
    args = serializers.ListField(
        child=StrictCharField(max_length=4000, allow_blank=True), required=False, max_length=1024
    )
    # The built-in trainer's eval mode: held-out batches per rank, samples.
    max_batches = StrictIntegerField(required=False, min_value=1, max_value=10_000)
    samples = StrictIntegerField(required=False, min_value=0, max_value=16)
    sample_tokens = StrictIntegerField(required=False, min_value=1, max_value=512)

    def validate_entrypoint(self, value):
        return _entrypoint(value)

    def run_validation(self, data=empty):
        # Nested, the block may be absent (a form post has no `eval` at all):
        # skipped as any optional field is, before the strict object check.
        is_empty, data = self.validate_empty_values(data)
        if is_empty:
            return data
        return super().run_validation(data)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        errors = {}
        every_n, every = attrs.get("every_n_checkpoints"), attrs.get("every_checkpoint")
        if every_n is None and not every:
            errors["every_n_checkpoints"] = [
                "Say which checkpoints to evaluate: every_n_checkpoints (1 or more) or "
                "every_checkpoint: true."]
        elif every_n is not None and every:
            errors["every_checkpoint"] = ["Give every_n_checkpoints or every_checkpoint, "
                                          "not both."]
        if attrs.get("args") and not attrs.get("entrypoint"):
            errors["args"] = ["Arguments go to an entrypoint."]
        builtin = [k for k in ("max_batches", "samples", "sample_tokens") if k in attrs]
        if attrs.get("entrypoint") and builtin:
            errors[builtin[0]] = ["Set for the built-in eval mode; an entrypoint takes args."]
        if errors:
            raise serializers.ValidationError(errors)
        attrs.setdefault("nodes", 1)
        attrs.setdefault("gpus_per_node", 1)
        return attrs


class JobSpecValidator(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=100)
    team = StrictCharField(required=False, max_length=63,
                           help_text="a team you belong to; required unless you belong to "
                                     "exactly one")
    cluster = StrictCharField(max_length=63, help_text="a cluster's name")
    pool = StrictCharField(required=False, max_length=63,
                           help_text="one of the cluster's node pools; default: its first")
    num_nodes = StrictIntegerField(min_value=1, max_value=1024)
    gpus_per_node = StrictIntegerField(min_value=1, max_value=64)
    world_size = StrictIntegerField(required=False, min_value=1, max_value=65536)
    strategy = serializers.ChoiceField(choices=TrainingJob.Strategy.choices, required=False)
    image = StrictCharField(required=False, max_length=300)
    entrypoint = serializers.ListField(
        child=StrictCharField(max_length=1000, allow_blank=True), required=False, max_length=256
    )
    args = serializers.ListField(
        child=StrictCharField(max_length=4000, allow_blank=True), required=False, max_length=1024
    )
    env = EnvField(required=False)
    completion = serializers.ChoiceField(choices=TrainingJob.Completion.choices, required=False)
    hyperparameters = serializers.DictField(required=False)
    checkpoint_policy = serializers.ChoiceField(
        choices=TrainingJob.CheckpointPolicy.choices, required=False
    )
    checkpoint_every_steps = StrictIntegerField(required=False, min_value=1, max_value=1_000_000)
    keep_last = StrictIntegerField(required=False, min_value=1, max_value=100)
    restart_budgets = RestartBudgetsField(required=False)
    # The window of progress after which spent restarts are forgiven; 0 turns
    # that half off (both 0: a budget counts for the whole run).
    budget_reset_steps = StrictIntegerField(required=False, min_value=0, max_value=100_000_000)
    budget_reset_minutes = StrictIntegerField(required=False, min_value=0, max_value=525_600)
    priority = StrictIntegerField(required=False, min_value=-1000, max_value=1000)
    spot_allowed = StrictBooleanField(required=False)
    storage_uri = StrictCharField(required=False, max_length=1000)
    eval = EvalSpecValidator(required=False)

    def validate_strategy(self, value):
        if not isinstance(self.initial_data.get("strategy"), str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate_completion(self, value):
        if not isinstance(self.initial_data.get("completion"), str):
            raise serializers.ValidationError("Must be a string.")
        return value

    def validate_env(self, value):
        return _program_env(value)

    def validate_entrypoint(self, value):
        return _entrypoint(value)

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
            if (isinstance(budget, bool) or not isinstance(budget, int)
                    or not 0 <= budget <= MAX_BUDGET):
                raise serializers.ValidationError(
                    f"{key}: must be an integer from 0 to {MAX_BUDGET}.")
        return {**DEFAULT_RESTART_BUDGETS, **value}

    def validate_team(self, value):
        team = Team.objects.filter(name=value).first()
        user = self.context["request"].user
        if team is None or not acts_for_team(user, team):
            raise serializers.ValidationError(f"You are not a member of a team named {value!r}.")
        return team

    def validate_cluster(self, value):
        return cluster_named(value)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        errors = {}
        self._default_team(attrs, errors)
        pool = self._pool(attrs, errors)
        if pool is not None:
            attrs["pool"] = pool
            errors.update(_fits(pool, attrs))
        errors.update(_world_size(attrs))
        errors.update(_program(attrs))
        errors.update(isolation.check_spec(attrs))
        errors.update(_hyperparameters(attrs))
        errors.update(_storage(attrs))
        errors.update(_eval(attrs))
        if errors:
            raise serializers.ValidationError(errors)
        attrs.pop("world_size", None)
        return attrs

    def _default_team(self, attrs, errors) -> None:
        if "team" in attrs or "team" in self.initial_data:
            return
        user = self.context["request"].user
        teams = list(Team.objects.filter(members=user)[:2])
        if len(teams) == 1:
            attrs["team"] = teams[0]
        else:
            errors["team"] = ["Required: you belong to several teams." if teams
                              else "Required: you belong to no team."]

    def _pool(self, attrs, errors):
        cluster = attrs.get("cluster")
        if cluster is None or ("pool" not in attrs and "pool" in self.initial_data):
            return None
        pools = NodePool.objects.filter(cluster=cluster)
        pool = pools.filter(name=attrs["pool"]).first() if "pool" in attrs else pools.first()
        if pool is None:
            errors["pool"] = [
                f"unknown pool {attrs['pool']!r} on cluster {cluster.name}" if "pool" in attrs
                else f"cluster {cluster.name} has no node pools"
            ]
        return pool


def _fits(pool, attrs) -> dict:
    errors = {}
    gpus = attrs.get("gpus_per_node")
    if gpus is not None and gpus > pool.gpus_per_node:
        errors["gpus_per_node"] = [
            f"{gpus} GPUs per node, but nodes of pool {pool.name} have {pool.gpus_per_node}."
        ]
    nodes = attrs.get("num_nodes")
    if nodes is not None and nodes > pool.size:
        errors["num_nodes"] = [
            f"{nodes} nodes, but pool {pool.name} has only {pool.size}; it could never be placed."
        ]
    return errors


def _eval(attrs) -> dict:
    """The eval block's pool must be one of the job's cluster's, and its
    runs must fit there; what it keeps becomes the job's `eval_policy`."""
    policy = attrs.pop("eval", None)
    cluster = attrs.get("cluster")
    if policy is None or cluster is None:
        return {}
    pool = NodePool.objects.filter(cluster=cluster, name=policy["pool"]).first()
    if pool is None:
        return {"eval": {"pool": [f"unknown pool {policy['pool']!r} on cluster {cluster.name}"]}}
    fit = _fits(pool, {"num_nodes": policy["nodes"], "gpus_per_node": policy["gpus_per_node"]})
    if fit:
        return {"eval": {("nodes" if k == "num_nodes" else k): v for k, v in fit.items()}}
    if attrs.get("entrypoint") and not policy.get("entrypoint"):
        # The built-in eval mode loads the built-in trainer's checkpoints only.
        return {"eval": {"entrypoint": ["A job with its own entrypoint evaluates with its "
                                        "own: give the eval program's entrypoint."]}}
    if not policy.get("entrypoint") and TrainerConfig is not None:
        # The eval run's trainer config is the job's with eval mode on.
        try:
            TrainerConfig.from_dict({**(attrs.get("hyperparameters") or {}), "mode": "eval"})
        except ConfigError as exc:
            return {"eval": {"non_field_errors": [str(exc)]}}
    attrs["eval_policy"] = policy
    return {}


def _world_size(attrs) -> dict:
    nodes, gpus = attrs.get("num_nodes"), attrs.get("gpus_per_node")
    if "world_size" not in attrs or nodes is None or gpus is None:
        return {}
    if attrs["world_size"] == nodes * gpus:
        return {}
    return {"world_size": [
        f"world_size {attrs['world_size']} must equal num_nodes × gpus_per_node "
        f"= {nodes} × {gpus} = {nodes * gpus}."
    ]}


# The launch contract's names (torchrun's and Regatta's): a job's own env
# must not shadow them, or its ranks would not find each other or report.
RESERVED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
})
RESERVED_ENV_PREFIXES = ("REGATTA_", "TORCHELASTIC_")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A program's own hyperparameters go to its ranks as REGATTA_CONFIG, whole.
MAX_PROGRAM_CONFIG_BYTES = 65_536


def _entrypoint(value: list) -> list:
    """The program comes first: torchrun reads a leading `-…` as its own
    option (`--nproc_per_node`, `--rdzv_endpoint`, `--no-python`), and the
    launchers end torchrun's options before the program anyway
    (clusters/providers/program.py)."""
    if value and (not value[0] or value[0].startswith("-")):
        raise serializers.ValidationError(
            f"Must start with the program (a script's path or a console script), not "
            f"{value[0]!r}: a leading '-' would be one of torchrun's own options. Give a "
            "module's path, or a script that runs it.")
    return value


def _program_env(value: dict) -> dict:
    if len(value) > MAX_ENV_VARS:
        raise serializers.ValidationError(f"At most {MAX_ENV_VARS} variables.")
    problems = []
    for name, text in value.items():
        if not ENV_NAME.match(name):
            problems.append(f"{name!r}: not a variable name (letters, digits, _).")
        elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            problems.append(f"{name}: set by the launch (torchrun and Regatta); not yours to set.")
        elif not isinstance(text, str):
            problems.append(f"{name}: the value must be a string.")
        elif len(text) > MAX_ENV_VALUE or "\x00" in text:
            problems.append(f"{name}: at most {MAX_ENV_VALUE} characters, no NUL.")
    if problems:
        raise serializers.ValidationError(problems)
    return value


def _program(attrs) -> dict:
    """Arguments belong to an entrypoint; what "done" means defaults by kind
    (all ranks exit 0 for a program, the final checkpoint for the trainer)."""
    if attrs.get("args") and not attrs.get("entrypoint"):
        return {"args": ["Arguments go to an entrypoint; the built-in trainer takes "
                         "hyperparameters."]}
    if "completion" not in attrs:
        attrs["completion"] = (TrainingJob.Completion.EXIT if attrs.get("entrypoint")
                               else TrainingJob.Completion.CHECKPOINT)
    return {}


def _hyperparameters(attrs) -> dict:
    hyper = attrs.get("hyperparameters")
    if hyper is None:
        return {}
    if attrs.get("entrypoint"):
        # The program's own: any JSON object, checked for size only.
        size = len(json.dumps(hyper, separators=(",", ":")))
        if size > MAX_PROGRAM_CONFIG_BYTES:
            return {"hyperparameters": [f"{size} bytes as JSON; at most "
                                        f"{MAX_PROGRAM_CONFIG_BYTES}."]}
        return {}
    if TrainerConfig is None:
        return {}
    try:
        TrainerConfig.from_dict(hyper)
    except ConfigError as exc:
        return {"hyperparameters": [str(exc)]}
    return {}


def _storage(attrs) -> dict:
    """A given storage_uri, canonicalised, must lie under one of the
    cluster's storage roots and under the team's own folder there."""
    uri, team, cluster = attrs.get("storage_uri"), attrs.get("team"), attrs.get("cluster")
    if team is None or cluster is None:
        return {}
    try:
        if not uri:
            confinement.allowed_roots(cluster)  # where the default will go
            return {}
        attrs["storage_uri"] = confinement.confine(uri, team.name, cluster)
    except confinement.OutsideRoots as exc:
        return {"storage_uri" if uri else "cluster": [str(exc)]}
    return {}


class RestartValidator(StrictSerializer):
    """The step's shape only: whether the job has a checkpoint there to
    restart from is its state, not the request's (services.restart: 409)."""

    from_step = StrictIntegerField(min_value=0)


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
        return cluster_named(value)

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


class ProfileRequestValidator(StrictSerializer):
    """`POST /jobs/<id>/profile/`: how many of the next steps to profile."""

    steps = StrictIntegerField(min_value=1, max_value=50)
