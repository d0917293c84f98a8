"""What the fleet overview shows, read from the database.

The page does not grow with the fleet: per cluster and pool it shows counts
(one grouped query over the nodes), then the nodes that need attention
(capped), then one page of node tiles, which `?state=`, `?cluster=` and
`?pool=` narrow. Only the nodes on the page are read one by one.
"""

from collections import defaultdict
from dataclasses import dataclass, field

from django.core.paginator import Paginator
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, Sum

from clusters.models import Cluster, Node, NodeHealthEvent
from clusters.providers.local import worker_env
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
STATE_ORDER = [css for css, _ in LEGEND]
TILES_PER_PAGE = 100
ATTENTION_SHOWN = 50
# `?state=` for the tile grid: a tile colour, every node needing attention, or all.
STATE_FILTERS = ("all", "attention", *STATE_ORDER)


def _busy_ids():
    return AttemptNode.objects.filter(attempt__state__in=ACTIVE_ATTEMPT).values("node_id")


def _unhealthy_ids():
    return NodeHealthEvent.objects.filter(handled_at__isnull=True,
                                          severity__in=OPEN_SEVERITIES).values("node_id")


def _flag(condition: Q):
    return ExpressionWrapper(condition, output_field=BooleanField())


def _attention() -> Q:
    """A node someone should look at: out of service, a replacement that keeps
    failing or waits, or an open warning or critical health event."""
    return (Q(state__in=UNAVAILABLE) | Q(replace_failures__gt=0)
            | Q(replace_requested_at__isnull=False) | Q(pk__in=_unhealthy_ids()))


def live_nodes():
    return Node.objects.exclude(state__in=Node.RETIRED)


def css_of(state: str, is_spare: bool, busy: bool) -> str:
    if is_spare and state == Node.State.READY:
        return "spare"
    if state == Node.State.READY and busy:
        return "busy"
    return state


def by_css(nodes, css: str):
    """Nodes whose tile has colour `css` (see css_of). `id IN (subquery)`
    rather than a correlated EXISTS: PostgreSQL hashes the busy and
    unhealthy node ids once instead of probing per node."""
    ready, busy = Q(state=Node.State.READY), Q(pk__in=_busy_ids())
    return nodes.filter({
        "spare": ready & Q(is_spare=True),
        "busy": ready & Q(is_spare=False) & busy,
        "ready": ready & Q(is_spare=False) & ~busy,
        "attention": _attention(),
        "all": Q(),
    }.get(css, Q(state=css)))


@dataclass
class NodeTile:
    node: Node
    busy: bool = False
    job: object = None  # the TrainingJob running there, when the viewer may see it
    health: str = "ok"  # ok | warning | critical: the worst open health event
    # The gang there holds GPUs beyond its team's quota (jobs/admission/sharing.py):
    # the lending team may reclaim them.
    borrowed: bool = False

    @property
    def css(self) -> str:
        return css_of(self.node.state, self.node.is_spare, self.busy)


@dataclass
class Counts:
    """Nodes by tile colour, GPUs by use, spares, and nodes needing attention."""

    states: dict = field(default_factory=lambda: dict.fromkeys(STATE_ORDER, 0))
    nodes: int = 0
    gpus_total: int = 0
    gpus_in_use: int = 0
    gpus_free: int = 0
    gpus_cordoned: int = 0
    spares_ready: int = 0
    spares_total: int = 0
    attention: int = 0

    def add(self, row: dict) -> None:
        n, gpus, state, spare = row["n"], row["gpus"] or 0, row["state"], row["is_spare"]
        css = css_of(state, spare, row["busy"])
        self.states[css] = self.states.get(css, 0) + n
        self.nodes += n
        self.gpus_total += gpus
        self.spares_total += n if spare else 0
        self.spares_ready += n if css == "spare" else 0
        if row["busy"]:
            self.gpus_in_use += gpus
        elif state in UNAVAILABLE:
            self.gpus_cordoned += gpus
        elif css == "ready":
            self.gpus_free += gpus
        if row["attention"]:
            self.attention += n

    @property
    def state_counts(self) -> list[tuple[str, int]]:
        return [(css, self.states.get(css, 0)) for css in STATE_ORDER]


@dataclass
class PoolView:
    pool: object
    counts: Counts = field(default_factory=Counts)


@dataclass
class ClusterView:
    cluster: Cluster
    counts: Counts = field(default_factory=Counts)
    pools: list = field(default_factory=list)  # PoolView, by name
    tiles: list = field(default_factory=list)  # this page's tiles on this cluster

    def __getattr__(self, name):  # gpus_total, spares_ready, …: the cluster's counts
        if name.startswith(("gpus_", "spares_")):
            return getattr(self.counts, name)
        raise AttributeError(name)


def _grouped():
    """One row per (pool, state, spare, busy, needs attention) with its node
    and GPU counts: the summary's only pass over the nodes."""
    return (live_nodes().annotate(busy=_flag(Q(pk__in=_busy_ids())), attention=_flag(_attention()))
            .values("cluster_id", "pool_id", "state", "is_spare", "busy", "attention")
            .annotate(n=Count("id"), gpus=Sum("gpus")).order_by())


def summary() -> tuple[list[ClusterView], Counts]:
    """Every cluster with per-pool counts, and the fleet's totals."""
    views = {c.pk: ClusterView(cluster=c) for c in Cluster.objects.prefetch_related("pools")}
    pools = {}
    for view in views.values():
        view.pools = [PoolView(pool=p) for p in view.cluster.pools.all()]
        pools.update({p.pool.pk: p for p in view.pools})
    totals = Counts()
    for row in _grouped():
        for counts in (views[row["cluster_id"]].counts, pools[row["pool_id"]].counts, totals):
            counts.add(row)
    return list(views.values()), totals


def tiles(user, nodes) -> list[NodeTile]:
    """Tiles for these nodes (a page): their jobs and health in two queries;
    a tile names its job only for a viewer who may see that job."""
    nodes = list(nodes)
    ids = [n.pk for n in nodes]
    jobs = {row.node_id: row.attempt.job for row in AttemptNode.objects.filter(
        node_id__in=ids, attempt__state__in=ACTIVE_ATTEMPT).select_related("attempt__job")
        # A tile shows the job's name and whether it borrows: not its JSON spec.
        .only("node_id", "attempt__job__name", "attempt__job__borrowed_gpus")}
    visible = set(scoping.visible_jobs(user).filter(pk__in=[j.pk for j in jobs.values()])
                  .values_list("pk", flat=True))
    health = worst_health(ids)
    return [NodeTile(node=n, busy=n.pk in jobs, health=health.get(n.pk, "ok"),
                     job=jobs[n.pk] if jobs.get(n.pk) and jobs[n.pk].pk in visible else None,
                     borrowed=n.pk in jobs and jobs[n.pk].borrowed_gpus > 0) for n in nodes]


def worst_health(node_ids) -> dict:
    """node id → the worst severity among its unhandled warning/critical events."""
    worst = {}
    rows = NodeHealthEvent.objects.filter(
        node_id__in=node_ids, handled_at__isnull=True, severity__in=OPEN_SEVERITIES
    ).values_list("node_id", "severity")
    for node_id, severity in rows:
        if worst.get(node_id) != NodeHealthEvent.Severity.CRITICAL:
            worst[node_id] = severity
    return worst


def attention(limit: int = ATTENTION_SHOWN) -> list[Node]:
    """The nodes that need someone, most recently changed first, at most `limit`."""
    nodes = by_css(live_nodes(), "attention").select_related("cluster", "pool")
    rows = list(nodes.order_by("-state_changed_at", "-id")[:limit])
    health = worst_health([n.pk for n in rows])
    for node in rows:
        node.health = health.get(node.pk, "ok")
    return rows


def node_page(user, views: list[ClusterView], state: str, cluster: str, pool: str, page):
    """One page of tiles under the filters, dealt out to their clusters' views."""
    nodes = by_css(live_nodes(), state).select_related("pool")
    if cluster:
        nodes = nodes.filter(cluster__name=cluster)
    if pool:
        nodes = nodes.filter(pool__name=pool)
    # By cluster and name: the (cluster, name) unique index walks a page
    # without sorting the fleet.
    paged = Paginator(nodes.order_by("cluster_id", "name"), TILES_PER_PAGE).get_page(page)
    by_cluster = defaultdict(list)
    for tile in tiles(user, paged.object_list):
        by_cluster[tile.node.cluster_id].append(tile)
    for view in views:
        view.tiles = by_cluster.get(view.cluster.pk, [])
    return paged


def totals(counts: Counts) -> dict:
    keys = ("gpus_total", "gpus_in_use", "gpus_free", "gpus_cordoned", "spares_ready",
            "spares_total")
    return {k: getattr(counts, k) for k in keys}


def recent_health_events(limit: int = 15):
    return NodeHealthEvent.objects.select_related("node", "node__cluster")[:limit]


def worker_environment() -> str:
    """The local fleet's torch while it installs behind the running web
    (clusters/providers/local/worker_env.py), or "" once it is there."""
    if not Cluster.objects.filter(provider=Cluster.Provider.LOCAL).exists():
        return ""
    return worker_env.describe(worker_env.read_status())
