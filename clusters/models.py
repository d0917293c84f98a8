"""The fleet: clusters, node pools, nodes and what happened to them."""

import json

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from controlplane.lib.errors import PermanentError
from controlplane.lib.transitions import change_state, event_time
from controlplane.lib.typed_settings import SettingsError

from .settings import ClusterSettings, parse_pool


class Cluster(models.Model):
    class Provider(models.TextChoices):
        LOCAL = "local", "Local (torchrun on this machine)"
        KUBERNETES = "kubernetes", "Kubernetes (Kubeflow PyTorchJob)"
        SLURM = "slurm", "Slurm (one sbatch per attempt)"

    name = models.SlugField(max_length=63, unique=True)
    provider = models.CharField(max_length=20, choices=Provider.choices, default=Provider.LOCAL)
    # Read through `config` (clusters/settings.py): the reconcilers' pacing,
    # preflight and storage keys, and the provider's own (namespace, ...).
    settings = models.JSONField(default=dict, blank=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Status, written by the cluster reconciler.
    last_reconciled_at = models.DateTimeField(null=True, blank=True)
    next_reconcile_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # The reconciler's notes (e.g. a ReconcileError while passes fail) and
    # the last error a pass met, shown to operators.
    conditions = models.JSONField(default=list, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def config(self) -> ClusterSettings:
        """The typed settings; a bad key raises SettingsError (a PermanentError).
        Parsed again whenever the row's settings or provider changed."""
        return _memo(self, (self.provider, self.settings),
                     lambda: ClusterSettings.parse(self.settings, self.provider))

    def clean(self):
        _check_settings(lambda: ClusterSettings.parse(self.settings, self.provider))


class NodePool(models.Model):
    class Capacity(models.TextChoices):
        ON_DEMAND = "on_demand", "On-demand"
        SPOT = "spot", "Spot"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = models.SlugField(max_length=63)
    instance_type = models.CharField(max_length=64, default="local-cpu")
    gpus_per_node = models.PositiveIntegerField(default=1)
    capacity_type = models.CharField(
        max_length=16, choices=Capacity.choices, default=Capacity.ON_DEMAND
    )
    # Working nodes that take jobs, and idle spares kept ready beside them.
    size = models.PositiveIntegerField(default=2)
    spare_count = models.PositiveIntegerField(default=1)
    efa = models.BooleanField(default=False, help_text="Nodes carry EFA network devices")
    node_selector = models.JSONField(default=dict, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    # The provider's pool keys, e.g. {"asg_name": "..."}; read through `config`.
    settings = models.JSONField(default=dict, blank=True)
    # Status of the pool's asks for capacity (clusters/reconcile/scaling.py):
    # since when the provider's account of them is read (None: nothing
    # asked is on its way), its failures in a row (an Auto Scaling group's
    # failed launches), the last one's time and message, and the ids of those
    # recorded already. No ask is made before the backoff after a failure.
    scaling_watch_since = models.DateTimeField(null=True, blank=True)
    scaling_failures = models.PositiveIntegerField(default=0)
    scaling_failed_at = models.DateTimeField(null=True, blank=True)
    scaling_error = models.TextField(blank=True)
    scaling_permanent = models.BooleanField(default=False)
    scaling_seen = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="uniq_pool_name_per_cluster")
        ]

    def __str__(self):
        return f"{self.cluster.name}/{self.name}"

    @classmethod
    def hold(cls, pool_id: int) -> "NodePool | None":
        """Lock the pool's row for the caller's transaction and return it.

        Whatever changes how many working nodes a pool has (a promotion, a
        node back in service, a new node joining) takes this lock first, then
        counts: two passes deciding at once would each see the same free slot
        (clusters/reconcile/promotion.py). Always before any node row's lock,
        so the order never deadlocks. SQLite's IMMEDIATE transactions
        serialise writers the same way."""
        return cls.objects.select_for_update().filter(pk=pool_id).first()

    @property
    def config(self):
        """The provider's typed pool settings (its PoolSettings class)."""
        return _memo(self, (self.cluster.provider, self.settings),
                     lambda: parse_pool(self.settings, self.cluster.provider, self.name))

    @property
    def topology_label(self) -> str:
        """The node label a gang's nodes should share (clusters/settings.py)."""
        return str((self.settings or {}).get("topology_label") or "")

    def clean(self):
        try:
            provider = self.cluster.provider  # unsaved too: an inline of a new cluster
        except Cluster.DoesNotExist:
            return  # no cluster chosen yet: the form says so itself
        _check_settings(lambda: parse_pool(self.settings, provider, self.name))


def _memo(row, key, parse):
    # Settings are read many times a pass and change rarely; the key compares
    # by value, so an edited dict (or provider) is parsed again.
    key = json.dumps(key, sort_keys=True, default=str)
    cached = row.__dict__.get("_config_memo")
    if cached is None or cached[0] != key:
        cached = (key, parse())
        row.__dict__["_config_memo"] = cached
    return cached[1]


def _check_settings(parse) -> None:
    """A bad settings key is a form error on `settings` naming the key."""
    try:
        parse()
    except SettingsError as exc:
        raise ValidationError(
            {"settings": [f"{k}: {v}" for k, v in exc.problems.items()]}) from None
    except PermanentError as exc:  # an unknown provider
        raise ValidationError({"provider": [str(exc)]}) from None


class Node(models.Model):
    class State(models.TextChoices):
        PROVISIONING = "provisioning"
        READY = "ready"
        CORDONED = "cordoned"
        DRAINING = "draining"
        FAILED = "failed"
        REPLACED = "replaced"
        TERMINATED = "terminated"

    STATE_FIELD, STATE_KIND = "state", "node"
    # Which states each transition may start from.
    TRANSITIONS = {
        # Back from failed or replaced only through a return to service,
        # once a health check passed (clusters/reconcile/returns.py).
        State.READY: {State.PROVISIONING, State.CORDONED, State.FAILED, State.REPLACED},
        State.CORDONED: {State.READY, State.DRAINING, State.FAILED, State.PROVISIONING},
        State.DRAINING: {State.READY, State.CORDONED},
        State.FAILED: {State.PROVISIONING, State.READY, State.CORDONED, State.DRAINING},
        State.REPLACED: {State.CORDONED, State.DRAINING, State.FAILED},
        State.TERMINATED: {
            State.PROVISIONING, State.READY, State.CORDONED, State.DRAINING,
            State.FAILED, State.REPLACED,
        },
    }
    RETIRED = (State.REPLACED, State.TERMINATED)
    # In a pool's working set (when not a spare): what its `size` bounds.
    WORKING = (State.PROVISIONING, State.READY)
    # Leaving service for cause: a node back from these passes a check again.
    OUT_OF_SERVICE = (State.CORDONED, State.FAILED, State.DRAINING, *RETIRED)
    # Out for cause and not gone from the provider: may return to service
    # once a health check passes (clusters/reconcile/returns.py).
    RETURNABLE = (State.CORDONED, State.FAILED, State.REPLACED)

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    provider_id = models.CharField(max_length=253, blank=True)
    address = models.CharField(max_length=253, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROVISIONING)
    state_reason = models.CharField(max_length=300, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    # A spare waits outside the working set until a failed node needs replacing.
    is_spare = models.BooleanField(default=False)
    gpus = models.PositiveIntegerField(default=1)
    labels = models.JSONField(default=dict, blank=True)
    # What the provider itself last said of the node (Slurm's State and
    # Reason, a Kubernetes node's conditions), as the cluster pass saw it:
    # operators compare it with Regatta's own `state`.
    provider_status = models.JSONField(default=dict, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Reliability history, feeding the failure rate used by the "auto" interval.
    failure_count = models.PositiveIntegerField(default=0)
    ready_seconds = models.FloatField(default=0.0, help_text="Seconds spent ready, summed")
    # An operator asked for a replacement; the cluster reconciler carries it out.
    replace_requested_at = models.DateTimeField(null=True, blank=True)
    replaces = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replaced_by"
    )
    # The spare promoted into this working node's slot since it left
    # service (None: the slot is still owed, or it never left). `replaces`
    # is the lineage, kept for good; this is the current stay out of service
    # only, cleared when the node is back, so one that fails again is owed
    # a spare again (clusters/reconcile/promotion.py).
    successor = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The last time the node passed a preflight check (at a launch, or as a
    # spare when it joined). A launch on nodes that all passed recently skips
    # the check (jobs/reconcile/launch.py); taking a node out of service
    # clears it, so it is checked again before it is trusted.
    preflight_passed_at = models.DateTimeField(null=True, blank=True)
    # When the provider was last asked to drain the node (evict what runs on
    # it): asked once per stay in a state, i.e. again only after a change.
    drain_sent_at = models.DateTimeField(null=True, blank=True)
    # A claimed replacement's provider side (clusters/reconcile/replacement.py):
    # when it was last asked of the provider (None: owed, not asked yet), and
    # the provider's failures in a row, the last one's time and message; the
    # cluster reconcile asks again with backoff until one succeeds.
    replace_asked_at = models.DateTimeField(null=True, blank=True)
    replace_failures = models.PositiveIntegerField(default=0)
    replace_error = models.TextField(blank=True)
    replace_failed_at = models.DateTimeField(null=True, blank=True)
    # When the provider let the retired machine go once its drain was done
    # (an Auto Scaling termination hook completed); None while still owed.
    released_at = models.DateTimeField(null=True, blank=True)
    # The scheduler's own hold on the node that Regatta follows (an admin's
    # drain in Slurm, a kubectl cordon: NodeInfo.admin_hold), as last seen;
    # "" when none. The node is cordoned for it and comes back when it lifts.
    admin_hold = models.CharField(max_length=300, blank=True)
    # Since when the provider has reported the node not ready: it fails only
    # once that lasted the cluster's `node_failure_grace_s` (a scheduler's
    # restart or a brief UNKNOWN is no failure); None while it is ready.
    not_ready_since = models.DateTimeField(null=True, blank=True)
    # Out of service, the node was seen held or down at the provider since
    # it left: its turning available there later is its owner mending and
    # resuming it, which starts a return to service.
    provider_held = models.BooleanField(default=False)
    # A return to service under way (asked by an operator, or the provider
    # showed the node back): the cluster pass checks the node, and it is
    # ready again only if the check passes (clusters/reconcile/returns.py).
    return_requested_at = models.DateTimeField(null=True, blank=True)
    return_requested_by = models.CharField(max_length=150, blank=True)
    # The keys of the continuous health signals (HealthSignal.continuous)
    # the last pass saw on the node: a key not among them is a new spell.
    active_signals = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="uniq_node_name_per_cluster")
        ]
        indexes = [models.Index(fields=["cluster", "state"])]

    def __str__(self):
        return self.name

    @property
    def state_label(self) -> str:
        return self.name

    @property
    def provider_summary(self) -> str:
        """`provider_status` in one line: the provider's own state and reason
        where it has them (Slurm: "DOWN+DRAIN — Not responding"), else its
        conditions as name=value."""
        status = self.provider_status or {}
        if status.get("State"):
            reason = status.get("Reason") or ""
            return f"{status['State']} — {reason}" if reason else status["State"]
        return ", ".join(f"{k}={v}" for k, v in status.items())

    @property
    def drain_sent(self) -> bool:
        """The provider was asked to drain the node since its last state change."""
        return self.drain_sent_at is not None and self.drain_sent_at >= self.state_changed_at

    def preflight_age_s(self, now) -> float | None:
        """Seconds since the node last passed a preflight check; None if never."""
        if self.preflight_passed_at is None:
            return None
        return max(0.0, (now - self.preflight_passed_at).total_seconds())

    def transition(self, target, *, reason: str, actor: str = "reconciler", evidence=None,
                   now=None, still_in=None, **fields) -> "NodeEvent | None":
        """Move to `target` if the current state allows it; record why.

        A node already in `target` is left alone (None is returned), so a
        repeated cordon writes nothing. `still_in`: the states the caller
        read the node in, when what it saw only holds there; a row another
        pass moved out of them meanwhile is left alone too. Anything else
        not allowed raises.
        """
        now = now or timezone.now()
        if target in self.OUT_OF_SERVICE:
            fields.setdefault("preflight_passed_at", None)
        if target == self.State.READY:
            fields["successor"] = None  # back in service: a later failure is owed a spare
        with transaction.atomic():
            if target == self.State.READY:
                NodePool.hold(self.pool_id)  # counted and joined as one step
                self.refresh_from_db(fields=["is_spare"])
            if target == self.State.READY and self._pool_is_full():
                # Its working slot was filled while it was out (a spare was
                # promoted): back in service, it waits as a spare, so the
                # pool never runs over its size.
                fields["is_spare"] = True
                reason = f"{reason}; rejoins as a spare (pool {self.pool.name} is full)"
            # Conditional on the row, not on this object: node rows are read
            # early and acted on late by several passes.
            moved_on = () if still_in is None else tuple(
                state for state in self.State.values if state not in still_in)
            source = change_state(self, target, expected=None, noop_from=(target, *moved_on),
                                  changed_at_field="state_changed_at", now=now,
                                  state_reason=reason[:300], **fields)
            if source is None:
                return None
            return NodeEvent.objects.create(
                node=self, from_state=source, to_state=target, reason=reason,
                actor=actor, evidence=evidence or {}, created_at=event_time(now),
            )

    def _pool_is_full(self) -> bool:
        if self.is_spare:
            return False
        working = Node.objects.filter(
            pool_id=self.pool_id, is_spare=False, state__in=self.WORKING,
        ).exclude(pk=self.pk).count()
        size = NodePool.objects.filter(pk=self.pool_id).values_list("size", flat=True).first()
        return working >= (size or 0)

    def note(self, reason: str, *, evidence=None, now=None) -> "NodeEvent":
        """Something happened on the node that changes no state (a rank died
        on it): its timeline says so, and later passes read it back."""
        return NodeEvent.objects.create(
            node=self, from_state=self.state, to_state=self.state, reason=reason[:300],
            evidence=evidence or {}, created_at=event_time(now),
        )

    def request_return(self, *, actor: str, reason: str, now=None) -> "NodeEvent | None":
        """Mark the node for a return to service; the cluster pass checks it
        and puts it back (clusters/reconcile/returns.py). None when a return
        is under way already, or the node is not out for cause, or it is
        held by the scheduler's admin."""
        now = now or timezone.now()
        changed = Node.objects.filter(
            pk=self.pk, state__in=self.RETURNABLE, return_requested_at__isnull=True,
            admin_hold="",
        ).update(return_requested_at=now, return_requested_by=actor)
        if not changed:
            return None
        self.refresh_from_db()
        return NodeEvent.objects.create(
            node=self, from_state=self.state, to_state=self.state, actor=actor,
            reason=f"{RETURN_ASKED}: {reason}; it returns once a health check passes"[:300],
            created_at=event_time(now))

    def cordon(self, reason, **kw):
        return self.transition(self.State.CORDONED, reason=reason, **kw)

    def uncordon(self, reason="uncordoned", **kw):
        return self.transition(self.State.READY, reason=reason, **kw)

    def drain(self, reason, **kw):
        return self.transition(self.State.DRAINING, reason=reason, **kw)


RETURN_ASKED = "return to service asked"


class NodeEvent(models.Model):
    """Why a node changed state: the node's own timeline."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=300)
    actor = models.CharField(max_length=150, default="reconciler")
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class NodeHealthEvent(models.Model):
    class Kind(models.TextChoices):
        DCGM = "dcgm", "DCGM diagnostic"
        XID = "xid", "XID error"
        ECC = "ecc", "ECC error"
        THERMAL = "thermal", "Thermal"
        MISSED_HEARTBEAT = "missed_heartbeat", "Missed heartbeats"
        NCCL_TEST = "nccl_test", "Collective test"
        SPOT_NOTICE = "spot_notice", "Spot interruption notice"
        LOST = "lost", "Node lost"
        NODE_CONDITION = "node_condition", "Node condition"

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        CRITICAL = "critical"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    message = models.CharField(max_length=500)
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Set once the reconciler has acted on it; open critical events are work to do.
    handled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["node", "handled_at"])]
