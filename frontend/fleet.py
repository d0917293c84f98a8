"""What the fleet overview and node pages show, read from the database."""

from dataclasses import dataclass, field

from clusters.models import Cluster, Node, NodeHealthEvent
from jobs.models import AttemptNode, JobAttempt

from . import scoping

ACTIVE_ATTEMPT = (JobAttempt.State.PREFLIGHT, JobAttempt.State.STARTING, JobAttempt.State.RUNNING)
# Nodes that hold GPUs nobody can be given right now.
UNAVAILABLE = (Node.State.CORDONED, Node.State.DRAINING, Node.State.FAILED)
OPEN_SEVERITIES = (NodeHealthEvent.Severity.WARNING, NodeHealthEvent.Severity.CRITICAL)
# The tile colours (NodeTile.css) and what each means, in the grid's legend.
LEGEND = [
    ("ready", "free"), ("busy", "running a job"), ("spare", "spare"),
    ("provisioning", "provisioning"), ("cordoned", "cordoned"), ("draining", "draining"),
    ("failed", "failed"),
]


@dataclass
class NodeTile:
    node: Node
    busy: bool = False
    job: object = None  # the TrainingJob running there, when the viewer may see it
    health: str = "ok"  # ok | warning | critical: the worst open health event
    # The gang there holds GPUs beyond its team's quota (jobs/sharing.py):
    # the lending team may reclaim them.
    borrowed: bool = False

    @property
    def css(self) -> str:
        if self.node.is_spare and self.node.state == Node.State.READY:
            return "spare"
        if self.node.state == Node.State.READY and self.busy:
            return "busy"
        return self.node.state


@dataclass
class ClusterView:
    cluster: Cluster
    tiles: list = field(default_factory=list)
    gpus_total: int = 0
    gpus_in_use: int = 0
    gpus_free: int = 0
    gpus_cordoned: int = 0
    spares_ready: int = 0
    spares_total: int = 0

    @property
    def pools(self):
        return self.cluster.pools.all()


def busy_nodes() -> dict:
    """node id → the job of the active attempt placed on it."""
    rows = AttemptNode.objects.filter(attempt__state__in=ACTIVE_ATTEMPT).select_related(
        "attempt__job"
    )
    return {row.node_id: row.attempt.job for row in rows}


def open_health() -> dict:
    """node id → the worst severity among its unhandled warning/critical events."""
    worst = {}
    rows = NodeHealthEvent.objects.filter(
        handled_at__isnull=True, severity__in=OPEN_SEVERITIES
    ).values_list("node_id", "severity")
    for node_id, severity in rows:
        if worst.get(node_id) != NodeHealthEvent.Severity.CRITICAL:
            worst[node_id] = severity
    return worst


def cluster_views(user) -> list[ClusterView]:
    """Every cluster with its node tiles; a tile names its job only for a
    viewer who may see that job."""
    busy, health = busy_nodes(), open_health()
    visible = set(
        scoping.visible_jobs(user).filter(pk__in=[j.pk for j in busy.values()])
        .values_list("pk", flat=True)
    )
    views = []
    clusters = Cluster.objects.prefetch_related("pools")
    nodes = Node.objects.exclude(state__in=Node.RETIRED).select_related("pool", "cluster")
    by_cluster: dict[int, list[Node]] = {}
    for node in nodes:
        by_cluster.setdefault(node.cluster_id, []).append(node)
    for cluster in clusters:
        view = ClusterView(cluster=cluster)
        for node in by_cluster.get(cluster.pk, []):
            job = busy.get(node.pk)
            tile = NodeTile(node=node, busy=job is not None, health=health.get(node.pk, "ok"),
                            job=job if job is not None and job.pk in visible else None,
                            borrowed=job is not None and job.borrowed_gpus > 0)
            view.tiles.append(tile)
            view.gpus_total += node.gpus
            if node.is_spare:
                view.spares_total += 1
                view.spares_ready += node.state == Node.State.READY
            if tile.busy:
                view.gpus_in_use += node.gpus
            elif node.state in UNAVAILABLE:
                view.gpus_cordoned += node.gpus
            elif node.state == Node.State.READY and not node.is_spare:
                view.gpus_free += node.gpus
        views.append(view)
    return views


def totals(views: list[ClusterView]) -> dict:
    keys = ("gpus_total", "gpus_in_use", "gpus_free", "gpus_cordoned", "spares_ready",
            "spares_total")
    return {k: sum(getattr(v, k) for v in views) for k in keys}


def recent_health_events(limit: int = 15):
    return NodeHealthEvent.objects.select_related("node", "node__cluster")[:limit]
