"""Operator actions on a node, through the same clusters.services functions
the API's node endpoints call."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from clusters import services
from clusters.models import Node
from clusters.providers.base import FaultKind
from controlplane.lib.errors import IllegalTransition, Refused, RegattaError
from frontend import scoping

ACTIONS = {
    "cordon": services.cordon,
    "uncordon": services.uncordon,
    "drain": services.drain,
    "replace": services.request_replacement,
    "return": services.return_to_service,
}
REASON_MAX = 250


def _operator_node(request, pk):
    if not scoping.is_operator(request.user):
        return None
    return get_object_or_404(Node.objects.select_related("cluster", "pool"), pk=pk)


@login_required
@require_POST
def node_action(request, pk: int, action: str):
    if action not in ACTIONS:
        raise Http404("No such action.")
    node = _operator_node(request, pk)
    if node is None:
        return HttpResponseForbidden("Only operators may do this.")
    # A form cannot carry a lone surrogate, but it can carry NUL (%00), which
    # PostgreSQL refuses: dropped here, as the API refuses it (400).
    reason = request.POST.get("reason", "").replace("\x00", "").strip()[:REASON_MAX]
    try:
        event = ACTIONS[action](node, request.user, reason)
    except IllegalTransition as exc:
        messages.error(request, f"Cannot {action} {node.name}: it is {exc.current}.")
    except Refused as exc:
        messages.error(request, str(exc))
    else:
        if event is None:
            messages.info(request, f"{node.name}: nothing to do, already {action}ed.")
        else:
            messages.success(request, f"{node.name}: {event.reason}.")
    return redirect("frontend:node", node.pk)


@login_required
@require_POST
def node_fault(request, pk: int):
    node = _operator_node(request, pk)
    if node is None:
        return HttpResponseForbidden("Only operators may do this.")
    kind = request.POST.get("kind", "")
    if kind not in FaultKind.ALL:
        choices = ", ".join(FaultKind.ALL)
        messages.error(request, f"Unknown fault {kind!r}; choose one of {choices}.")
        return redirect("frontend:node", node.pk)
    try:
        services.inject_fault(node, kind)
    except RegattaError as exc:
        messages.error(request, f"Fault not injected: {exc}")
    else:
        messages.success(request, f"Injected {kind} into {node.name}.")
    return redirect("frontend:node", node.pk)
