"""The provider protocol: the one way the control plane touches a fleet.

Providers speak in plain dataclasses, never in model rows, so they can be
tested alone; the cluster and job reconcilers map them to rows.

Errors: raise `controlplane.lib.errors.TemporaryError` for what is worth a
retry after a delay (429, 5xx, timeouts), `PermanentError` for what is not
(403, 422, a bad setting); anything else is retried with backoff.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypedDict, runtime_checkable


@dataclass(frozen=True)
class NoSettings:
    """The settings section of a provider that has none of its own."""


@dataclass(frozen=True)
class PoolInfo:
    """What a provider needs to know about a node pool."""

    cluster: str
    name: str
    instance_type: str
    gpus_per_node: int
    capacity_type: str = "on_demand"  # or "spot"
    size: int = 1
    spare_count: int = 0
    efa: bool = False
    node_selector: dict = field(default_factory=dict)
    tolerations: list = field(default_factory=list)
    # The provider's own typed pool settings (its `PoolSettings` class).
    settings: object = field(default_factory=NoSettings)


@dataclass(frozen=True)
class NodeInfo:
    """A node as the provider sees it."""

    name: str
    provider_id: str = ""
    address: str = ""
    gpus: int = 1
    ready: bool = True
    unschedulable: bool = False
    labels: dict = field(default_factory=dict)
    # Provider conditions worth recording, e.g. {"Ready": "True", "GpuHealthy": "False"}.
    conditions: dict = field(default_factory=dict)
    # Someone other than Regatta took the node out of placement in the
    # scheduler itself (an admin's `scontrol update state=drain`, a `kubectl
    # cordon`): their reason, in the scheduler's words; "" when nothing but
    # Regatta holds it. Regatta follows it both ways: the node leaves its
    # placement while the hold lasts and comes back when it lifts
    # (clusters/reconcile/nodes.py).
    admin_hold: str = ""


@dataclass(frozen=True)
class HealthSignal:
    """Something the provider saw about a node: an XID, a spot notice, a
    failed DCGM check. The cluster reconciler turns it into a NodeHealthEvent."""

    node: str
    kind: str  # a NodeHealthEvent.Kind value
    severity: str  # info | warning | critical
    message: str
    evidence: dict = field(default_factory=dict)
    # Stable id so the same signal seen twice is recorded once.
    key: str = ""
    # A state the node shows for as long as it lasts (a Kubernetes node
    # condition or label), rather than a one-off report (an XID read once):
    # each spell of it that Regatta observes is one event, keyed by the
    # spell Regatta saw begin, whatever time stamp the provider carries.
    continuous: bool = False


def interruption_key(instance: str, warning: bool) -> str:
    """The key of a spot interruption (or rebalance recommendation) of one
    instance, whichever source reported it: an EC2 notice read from SQS, or
    the taint AWS Node Termination Handler puts on the Node. An instance is
    interrupted once, so both sources make one health event, and one drain."""
    return f"spot-{'interruption' if warning else 'rebalance'}/{instance}"


@dataclass(frozen=True)
class ScalingFailure:
    """A request for capacity the provider took and then could not carry out,
    in its own words (an Auto Scaling group's failed or cancelled launch:
    `InsufficientInstanceCapacity` for a p5). `permanent`: asking again will
    not help until a setting changes (an invalid launch template)."""

    activity_id: str
    status: str  # the provider's word: Failed, Cancelled
    message: str
    description: str = ""
    started_at: str = ""
    permanent: bool = False


@dataclass(frozen=True)
class ScalingStatus:
    """How a pool's earlier asks for capacity went: `settled` once nothing
    asked is still on its way (the group is at its desired capacity, no
    activity in progress); `failures` since the time asked about."""

    settled: bool = True
    failures: tuple[ScalingFailure, ...] = ()


@dataclass(frozen=True)
class Placement:
    node: str
    node_rank: int
    provider_id: str = ""
    address: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """One attempt of a job, to run as a gang on `placements`."""

    job_id: int
    attempt_id: int
    attempt_number: int
    name: str  # a DNS-safe name unique to the attempt, e.g. "job-12-a3"
    pool: PoolInfo
    placements: tuple[Placement, ...]
    nproc_per_node: int
    image: str
    # argv after the launcher; empty means the built-in trainer (`-m trainer`).
    command: tuple[str, ...] = ()
    # The trainer's environment (docs/trainer-protocol.md), token included.
    env: dict = field(default_factory=dict)
    checkpoint_uri: str = ""
    # The job's team: providers that give each team its own identity
    # (Kubernetes' team_service_accounts) pick it by this name.
    team: str = ""
    # Nodes of the pool the attempt must not land on (cordoned, failed,
    # replaced), for providers whose scheduler picks among the pool's nodes
    # rather than taking `placements` as given (a Karpenter pool).
    avoid_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeProcess:
    """How the part of an attempt on one node is doing."""

    node: str
    node_rank: int
    running: bool
    exit_code: int | None = None  # the launcher's exit code, once it ended
    signal: int | None = None  # set when killed by a signal
    # Per-rank exit records the trainer wrote (REGATTA_STATUS_DIR/rank-N.json).
    ranks: tuple[dict, ...] = ()
    log_tail: str = ""
    # The provider saw the node go with the process (a pod evicted or lost
    # with its node, no container exit): node-level evidence, so a death
    # here is never taken for one process's (jobs/recovery/evidence.py).
    node_lost: str = ""


@dataclass(frozen=True)
class StartIssue:
    """Why an attempt, or one node's part of it, has not started, read
    before any process ran (a pod's waiting state, the scheduler, a queue).

    `user_error` marks the job's own mistake (an image that does not exist,
    a Secret it names that is missing): no relaunch can fix it, so the job
    fails fast. Anything else is a wait (capacity, a queue's quota): the
    attempt is neither running nor hung, and its reason is shown."""

    reason: str  # the platform's word: ImagePullBackOff, Unschedulable, ...
    message: str = ""
    user_error: bool = False
    node_rank: int | None = None  # None: the attempt as a whole (a queue)

    def describe(self) -> str:
        where = "" if self.node_rank is None else f"rank {self.node_rank}: "
        return f"{where}{self.reason}: {self.message}".rstrip(": ")


@dataclass(frozen=True)
class AttemptStatus:
    """What the provider observes of an attempt."""

    state: str  # "running" | "succeeded" | "failed" | "unknown"
    nodes: tuple[NodeProcess, ...] = ()
    message: str = ""
    # Why parts of a "running" attempt have not started yet; providers that
    # cannot tell leave it empty, and start-up deadlines alone apply.
    start_issues: tuple[StartIssue, ...] = ()
    # A gang scheduler took the admitted attempt back (Kueue evicted its
    # Workload: a preemption, or the Workload deactivated), in its words: the
    # ranks ended through no fault of their nodes or their code.
    taken_back: str = ""

    @property
    def user_errors(self) -> tuple[StartIssue, ...]:
        return tuple(i for i in self.start_issues if i.user_error)

    @property
    def waits(self) -> tuple[StartIssue, ...]:
        return tuple(i for i in self.start_issues if not i.user_error)

    @property
    def failed_nodes(self) -> tuple[NodeProcess, ...]:
        return tuple(
            n for n in self.nodes
            if not n.running and (n.signal is not None or (n.exit_code or 0) != 0)
        )


@dataclass(frozen=True)
class RankActivity:
    """What one rank of a launched attempt is doing before its first step,
    read on its node: the answer of `describe_startup(ref)`, the
    DescribesStartup capability (capabilities.py; the local provider's:
    clusters/providers/local/startup.py). `state` is one of
    STARTUP_STATES; `since_s` how long it has been in it, when known;
    `marked`: the rank said so itself (the SDK's start-up markers), where a
    program without the SDK shows only that its process lives."""

    rank: int
    node: str
    state: str
    since_s: float | None = None
    detail: str = ""
    marked: bool = False


STARTUP_STATES = ("not started", "importing", "rendezvous", "setting up", "loading checkpoint",
                  "compiling", "first step", "running without reporting", "exited", "gone")


@dataclass(frozen=True)
class LateLog:
    """A failed rank's log read once more, after the failure was acted on
    without it (it could not be read then): the answer of `late_logs(now)`
    (`now` in Unix seconds), the KeepsLateLogs capability (capabilities.py),
    which the cluster pass asks
    (clusters/reconcile/late_logs.py) for the job's timeline. `text` is the
    log's tail, or "" with `unreachable` saying why it still could not be
    read; `first_unreachable` why it could not be read at the failure."""

    job_id: int | None
    attempt_id: int | None
    node: str
    node_rank: int | None
    text: str = ""
    unreachable: str = ""
    first_unreachable: str = ""
    kept_s: float = 0.0


class NodeCheck(TypedDict, total=False):
    """One node's part of a preflight check, as `PreflightEvidence.per_node`
    holds it. A passing node carries its measurements; a failing one `check`
    (which check it failed: "self-test", "allreduce", "report", "dcgm", ...)
    and `error` (why, in the provider's words), which become the evidence of
    the health event that cordons it."""

    ok: bool
    check: str
    error: str
    busbw_gbps: float  # all-reduce bus bandwidth this node measured, GB/s
    algbw_gbps: float
    seconds: float


class PreflightEvidence(TypedDict, total=False):
    """The one shape of `PreflightResult.evidence`, whatever the provider.
    Providers may add keys of their own (`method`, `job`, `run_dir`, ...)."""

    # The gang runs at its slowest node's pace: the minimum of the nodes'
    # `busbw_gbps`, None when no node measured one.
    allreduce_gbps: float | None
    seconds: float  # how long the whole check took
    per_node: dict[str, NodeCheck]  # every checked node, by name
    dcgm: dict | str  # DCGM diagnostics, or why they did not run


def preflight_evidence(per_node: dict[str, NodeCheck], *, seconds: float,
                       **extra) -> PreflightEvidence:
    """Build the evidence in the protocol's shape, bandwidth derived once here."""
    measured = [c["busbw_gbps"] for c in per_node.values()
                if isinstance(c.get("busbw_gbps"), int | float)]
    return PreflightEvidence(allreduce_gbps=min(measured) if measured else None,
                             seconds=round(seconds, 3), per_node=per_node, **extra)


@dataclass(frozen=True)
class PreflightResult:
    """A short health check of the chosen nodes before an attempt starts."""

    ok: bool
    failed_nodes: tuple[str, ...] = ()
    evidence: PreflightEvidence = field(default_factory=dict)
    message: str = ""
    # The check runs beside the pass, not in it (a Kubernetes job of its
    # own): no answer yet. Ask again with the same placements in a later
    # pass; the provider finds the check it started and reads its result.
    pending: bool = False

    @property
    def allreduce_gbps(self) -> float | None:
        return self.evidence.get("allreduce_gbps")

    def node_check(self, node: str) -> NodeCheck:
        """What the check found on `node` ({} when the provider said nothing)."""
        return dict((self.evidence.get("per_node") or {}).get(node) or {})


class FaultKind:
    KILL = "kill"
    HANG = "hang"
    XID = "xid"
    SPOT_NOTICE = "spot_notice"
    PREFLIGHT_FAIL = "preflight_fail"
    # One rank process SIGKILLed on a healthy node, as the kernel's OOM
    # killer does: relaunched in place (jobs/recovery/evidence.py).
    KILL_RANK = "kill_rank"
    ALL = (KILL, HANG, XID, SPOT_NOTICE, PREFLIGHT_FAIL, KILL_RANK)


@runtime_checkable
class Provider(Protocol):
    """What every provider does: keep a fleet's nodes, and run attempts on
    them. All calls are idempotent: calling twice with the same arguments
    does no more than calling once. What only some providers do (health
    signals, an autoscaler's account, fault injection, ...) is a capability
    of its own (capabilities.py), never a stub here."""

    kind: str
    # Typed sections of Cluster.settings and NodePool.settings that this
    # provider reads (frozen dataclasses of controlplane.lib.typed_settings
    # fields; NoSettings for none). clusters/settings.py parses them.
    Settings: type
    PoolSettings: type

    @classmethod
    def for_cluster(cls, name: str, settings) -> Provider:
        """The provider of cluster `name`, from its parsed `Settings`."""

    # --- nodes ---------------------------------------------------------------
    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        """Every node of the pool the provider knows, spares included."""

    def provision_node(self, pool: PoolInfo, name: str) -> NodeInfo:
        """Bring up one more node for the pool (a spare). May return a node that
        is not ready yet; it turns ready in a later `list_nodes`. Whether a
        pool can grow is the pool's (a Kubernetes pool with or without a node
        group): one that cannot raises PermanentError saying where its nodes
        come from."""

    def cordon(self, pool: PoolInfo, node: str) -> None:
        ...

    def uncordon(self, pool: PoolInfo, node: str) -> None:
        ...

    def drain(self, pool: PoolInfo, node: str, grace_s: float = 60.0) -> None:
        """Evict what runs on the node, leaving time for an emergency checkpoint."""

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        """Retire the node and ask for a new one; return it if known now.
        Never waits for it: a machine the provider brings up later is found
        by a later `list_nodes` and joins as a spare."""

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        """Keep `nodes`, the pool's ready spares (all of them: a node left
        out is no spare any more), for Regatta alone where the platform
        would give an idle node to others' work (a Slurm reservation), or
        warm for a quick start (a standby on each)."""

    # --- attempts ------------------------------------------------------------
    def preflight(self, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float = 60.0) -> PreflightResult:
        ...

    def launch(self, request: LaunchRequest) -> dict:
        """Start the attempt; return a JSON-able ref that `observe` and `stop`
        take, enough to find the attempt again after a worker restart."""

    def observe(self, ref: dict) -> AttemptStatus:
        ...

    def stop(self, ref: dict, grace_s: float = 30.0) -> None:
        """Stop every rank of the attempt (SIGTERM, then SIGKILL after grace)."""
