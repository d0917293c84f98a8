from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404
from django.urls import reverse

from clusters.models import Cluster, Node
from clusters.providers.base import FaultKind
from frontend import scoping
from jobs.models import AttemptNode

from . import live

HISTORY = 50
PARTIALS = {
    "node-status": "frontend/partials/node_status.html",
    "node-actions": "frontend/partials/node_actions.html",
    "node-events": "frontend/partials/node_events.html",
    "node-health": "frontend/partials/health_events.html",
    "node-jobs": "frontend/partials/node_jobs.html",
}
NODE_ACTIONS = [
    ("cordon", "Cordon", "ghost", Node.State.CORDONED),
    ("uncordon", "Uncordon", "ghost", Node.State.READY),
    ("drain", "Drain", "ghost", Node.State.DRAINING),
    ("replace", "Replace", "danger", None),
    ("return", "Return to service", "ghost", None),
]


def node_actions(node: Node) -> list[tuple[str, str, str]]:
    """The actions the node's state allows, so no button leads to a refusal."""
    out = []
    for action, label, css, target in NODE_ACTIONS:
        if action == "return":
            # A mended node back after a health check (clusters/reconcile/
            # returns.py); an admin's hold is lifted where it was put.
            if (node.state in Node.RETURNABLE and node.return_requested_at is None
                    and not node.admin_hold):
                out.append((action, label, css))
        elif target is None:
            if node.state not in Node.RETIRED and node.replace_requested_at is None:
                out.append((action, label, css))
        elif action == "uncordon" and node.state != Node.State.CORDONED:
            continue  # failed or replaced: back only through a return to service
        elif node.state != target and node.state in Node.TRANSITIONS[target]:
            out.append((action, label, css))
    return out
FAULTS = [
    (FaultKind.KILL, "Kill the ranks"),
    (FaultKind.KILL_RANK, "Kill one rank (as the OOM killer)"),
    (FaultKind.HANG, "Hang (SIGSTOP)"),
    (FaultKind.XID, "GPU XID error"),
    (FaultKind.SPOT_NOTICE, "Spot interruption notice"),
]


def _context(request, node: Node) -> dict:
    placements = (
        AttemptNode.objects.filter(node=node, attempt__job__in=scoping.visible_jobs(request.user))
        .select_related("attempt__job__team")
        .order_by("-attempt__created_at")[:HISTORY]
    )
    return {
        "node": node,
        "is_operator": scoping.is_operator(request.user),
        "can_inject": node.cluster.provider == Cluster.Provider.LOCAL,
        "faults": FAULTS,
        "node_actions": node_actions(node),
        "node_events": node.events.all()[:HISTORY],
        "health_events": node.health_events.all()[:HISTORY],
        "hide_node": True,
        "placements": placements,
        "replaced_by": node.replaced_by.all(),
        "provider_made": _provider_made(node),
    }


def _provider_made(node: Node) -> Node | None:
    """The new machine the provider made when this node was replaced (it
    joined the spares), as against the spare promoted into its place
    (`replaced_by`): clusters/reconcile/replacement.py names it in the
    event's evidence."""
    event = (node.events.filter(evidence__new__isnull=False).exclude(evidence__new=None)
             .order_by("-created_at", "-id").first())
    name = (event.evidence or {}).get("new") if event else None
    if not name:
        return None
    return Node.objects.filter(cluster_id=node.cluster_id, name=name).first()


def _node(pk):
    return get_object_or_404(Node.objects.select_related("cluster", "pool", "replaces"), pk=pk)


@login_required
def node_detail(request, pk: int):
    node = _node(pk)
    return live.page(request, "frontend/node.html", _context(request, node),
                     reverse("frontend:node-live", args=[pk]))


@login_required
def node_live(request, pk: int):
    return live.fragments(request, PARTIALS, _context(request, _node(pk)))
