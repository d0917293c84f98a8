"""A cluster's and a pool's settings, typed: parsed once, checked when the
cluster or pool is saved (the admin's form, `Cluster.clean`), and read as
attributes everywhere else (`cluster.config`, `pool.config`).

`Cluster.settings` holds the keys every cluster understands (below: how the
reconcilers pace themselves, preflight, checkpoint storage) beside the keys
of its provider (e.g. KubeSettings: namespace, service account, ...);
`NodePool.settings` holds only its provider's pool keys (e.g. asg_name).
A key nobody declares is an error naming it: a typo found when the cluster
is saved, not as a silent default at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings as django_settings

from controlplane.lib.typed_settings import SettingsError, keys, parse, setting

from .providers.registry import provider_class

PREFLIGHT_OFF = ""


def _preflight(value):
    # true/false, or a provider's check mode (kubernetes: allreduce, dcgm-labels).
    if value is True:
        return "on"
    if value is False:
        return PREFLIGHT_OFF
    return value


@dataclass(frozen=True)
class ClusterSettings:
    # -- preflight -------------------------------------------------------------
    preflight: str = setting("on", "check chosen nodes before a launch: true, false, or a "
                             "provider's check mode", normalize=_preflight)
    preflight_timeout_s: float = setting(60.0, "time limit of one preflight check", minimum=0)
    # A launch on nodes that all passed a check this recently skips the check:
    # recovery's critical path. Spares are checked when they join.
    preflight_max_age_s: float = setting(3600.0, "a pass this recent skips the check",
                                         minimum=0)
    # -- pacing of the reconcilers -------------------------------------------------
    observe_interval_s: float = setting(5.0, "a running job is looked at this often",
                                        minimum=0)
    queue_interval_s: float = setting(10.0, "a waiting job is looked at this often", minimum=0)
    reconcile_interval_s: float | None = setting(
        None, "the cluster is reconciled this often (default: REGATTA_SWEEP_INTERVAL_S)",
        minimum=0)
    # -- failure detection and recovery -------------------------------------------
    heartbeat_deadline_s: float | None = setting(
        None, "missed heartbeats past this are a hang (default: REGATTA_HEARTBEAT_DEADLINE_S)",
        minimum=0)
    # Start-up has deadlines of its own, each shorter than a whole start-up
    # could take: every rank heard from after the launch, then a first step.
    first_heartbeat_deadline_s: float = setting(
        120.0, "a rank of a reporting program not heard from this long after the launch is "
        "hung", minimum=0)
    # Long enough for an SDK program's imports and rendezvous on a loaded host.
    no_heartbeat_grace_s: float = setting(
        20.0, "a program of the job's own with no heartbeat this long after its launch, every "
        "process alive, is one that sends none: it shows running (no heartbeats) and is "
        "watched by its processes alone", minimum=0)
    first_step_deadline_s: float = setting(
        900.0, "no first step this long after every rank reported is a start-up hang",
        minimum=0)
    # Long before those deadlines, a start-up that shows nothing says why.
    startup_report_after_s: float = setting(
        60.0, "an attempt with no first step this long after its launch gets a StartupReport "
        "event saying what each rank is doing, again when that changes (0: never)", minimum=0)
    # A peer that exits 84 may be seen before the rank that died and caused it;
    # wait this long for the root cause before calling the failure transient.
    root_cause_grace_s: float = setting(5.0, "wait for a failure's root cause", minimum=0)
    # A rank that dies on a node with no sign from the node is relaunched in
    # place (jobs/recovery/); a second death on the same node within this
    # window makes the node a suspect, checked before the relaunch uses it.
    process_repeat_window_s: float = setting(
        3600.0, "a rank death on a node where one died this recently makes it a suspect, "
        "health-checked before it is used again", minimum=0)
    # The job's own failures (the same error again and again) end the job,
    # not the fleet (jobs/recovery/).
    crash_loop_failures: int = setting(
        3, "failures in a row with the same signature (exit, signal, error line) after which "
        "a job ends failed with its error", minimum=2)
    max_nodes_retired_by_job: int = setting(
        1, "nodes one job's failures may take out of service on the job's own evidence "
        "(silent ranks, a rank dying there again) before its failures blame no node; "
        "evidence from the fleet itself (the scheduler, a health event) is not bounded",
        minimum=0)
    # The scheduler's view of a node (clusters/reconcile/nodes.py).
    node_failure_grace_s: float = setting(
        30.0, "a node the provider reports not ready fails only once that lasted this long "
        "(a scheduler's restart, a brief UNKNOWN or NodeStatusUnknown is no failure)",
        minimum=0)
    return_settle_s: float = setting(
        60.0, "a node returned to service may stay not ready this long once its hold is "
        "lifted (Slurm waits to hear from a resumed slurmd) before the return gives up on it",
        minimum=0)
    transient_backoff_s: float = setting(2.0, "first delay before a transient retry",
                                         minimum=0)
    transient_backoff_max_s: float = setting(60.0, "longest delay before a transient retry",
                                             minimum=0)
    stop_grace_s: float = setting(10.0, "SIGTERM to SIGKILL when stopping ranks", minimum=0)
    spot_checkpoint_wait_s: float = setting(60.0, "wait for the emergency checkpoint of a "
                                            "spot notice or drain", minimum=0)
    spot_deadline_margin_s: float = setting(10.0, "time kept before a notice's deadline to "
                                            "stop the gang", minimum=0)
    # -- sharing between teams (jobs/admission/sharing.py) -------------------------------------
    fair_share: bool = setting(True, "when more is asked than is free, admit teams in order "
                               "of GPUs held per unit of quota weight")
    preemption_checkpoint_wait_s: float = setting(
        120.0, "wait for a preempted gang's checkpoint and exit before stopping it",
        minimum=0)
    # -- what a job may change about its ranks (jobs/isolation.py) --------------------
    env_allow: tuple[str, ...] = setting(
        (), "environment variables jobs may set beyond the ones every job may (docs/byo.md: "
        "NCCL_*, LD_LIBRARY_PATH, AWS_*, ...): names, or prefixes ending in *")
    image_allow: tuple[str, ...] | None = setting(
        None, "images jobs may name: registries (registry.example.com) or repository "
        "prefixes (registry.example.com/ml/); default: any image")
    # -- checkpoint storage ----------------------------------------------------------
    storage_roots: tuple[str, ...] | None = setting(
        None, "storage roots jobs on this cluster may use, each under one of "
        "REGATTA_STORAGE_ROOTS (default: all of those)")
    region: str = setting("", "AWS region of the S3 checkpoint bucket")
    s3_endpoint_url: str = setting("", "S3 endpoint, e.g. a local moto server")
    s3_max_attempts: int = setting(5, "S3 client retries", minimum=1)
    # S3 rejects multipart parts under 5 MiB (except the last).
    s3_multipart_threshold_mb: float = setting(64.0, "S3 uploads above this go multipart",
                                               minimum=5)
    # The provider's own section (KubeSettings, ...), parsed from the same dict.
    provider: Any = field(default=None, init=True)

    @classmethod
    def parse(cls, raw: dict[str, Any] | None, provider_kind: str) -> ClusterSettings:
        raw = dict(raw or {})
        section_cls = provider_class(provider_kind).Settings
        unknown = set(raw) - (keys(cls) - {"provider"}) - keys(section_cls)
        if unknown:
            raise SettingsError("cluster", {k: f"is not a setting of {provider_kind} clusters"
                                            for k in sorted(unknown)})
        common = parse(cls, {k: v for k, v in raw.items() if k != "provider"})
        if "preflight" not in keys(section_cls) and common.preflight not in ("on", PREFLIGHT_OFF):
            raise SettingsError("cluster", {"preflight": "must be true or false"})
        section = section_cls.parse(raw) if hasattr(section_cls, "parse") else parse(
            section_cls, raw)
        return replace(common, provider=section)

    @property
    def preflight_on(self) -> bool:
        return self.preflight != PREFLIGHT_OFF

    @property
    def heartbeat_deadline(self) -> float:
        if self.heartbeat_deadline_s is not None:
            return self.heartbeat_deadline_s
        return django_settings.HEARTBEAT_DEADLINE_S

    @property
    def reconcile_interval(self) -> float:
        if self.reconcile_interval_s is not None:
            return self.reconcile_interval_s
        return django_settings.SWEEP_INTERVAL_S


# The one pool key every provider understands: a node label (a placement
# group, a rack, an EFA topology block) whose nodes a gang is kept within
# when it can be (jobs/admission/placement.py). Read as `NodePool.topology_label`.
TOPOLOGY_LABEL = "topology_label"


def parse_pool(raw: dict[str, Any] | None, provider_kind: str, pool_name: str = ""):
    """A pool's settings in its provider's PoolSettings class (the common
    `topology_label` is checked here and left out of it)."""
    raw = dict(raw or {})
    section_cls = provider_class(provider_kind).PoolSettings
    where = f"pool {pool_name}".strip()
    label = raw.pop(TOPOLOGY_LABEL, "")
    if not isinstance(label, str) or len(label) > 317:
        raise SettingsError(where, {TOPOLOGY_LABEL: "must be a node label name"})
    unknown = set(raw) - keys(section_cls)
    if unknown:
        raise SettingsError(where, {k: f"is not a pool setting of {provider_kind} clusters"
                                    for k in sorted(unknown)})
    return parse(section_cls, raw, where=where)
