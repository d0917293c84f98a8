from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.urls import reverse

from frontend import fleet as data

from . import live

PARTIALS = {
    "fleet-totals": "frontend/partials/fleet_totals.html",
    "fleet-env": "frontend/partials/fleet_env.html",
    "fleet-attention": "frontend/partials/fleet_attention.html",
    "fleet-clusters": "frontend/partials/fleet_clusters.html",
    "fleet-health": "frontend/partials/health_events.html",
}


def _filters(request) -> dict:
    return {"state": request.GET.get("state", "all").strip() or "all",
            "cluster": request.GET.get("cluster", "").strip(),
            "pool": request.GET.get("pool", "").strip()}


def _context(request, filters: dict):
    views, counts = data.summary()
    page = data.node_page(request.user, views, filters["state"], filters["cluster"],
                          filters["pool"], request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return {
        "clusters": views,
        "totals": data.totals(counts),
        "counts": counts,
        "attention": data.attention(),
        "fleet_env": data.worker_environment(),
        "page": page,
        "filters": filters,
        "state_filters": data.STATE_FILTERS,
        "query": query.urlencode(),  # the filters, for the pager's links
        "health_events": data.recent_health_events(),
        "legend": data.LEGEND,
    }


def _bad_state(filters: dict):
    if filters["state"] in data.STATE_FILTERS:
        return None
    return HttpResponseBadRequest(f"Unknown state {filters['state']!r}: one of "
                                  f"{', '.join(data.STATE_FILTERS)}.", content_type="text/plain")


@login_required
def fleet(request):
    filters = _filters(request)
    if bad := _bad_state(filters):
        return bad
    live_url = reverse("frontend:fleet-live")
    if request.GET:
        live_url += "?" + request.GET.urlencode()  # the live twin keeps the page's filters
    return live.page(request, "frontend/fleet.html", _context(request, filters), live_url)


@login_required
def fleet_live(request):
    filters = _filters(request)
    if bad := _bad_state(filters):
        return bad
    return live.fragments(request, PARTIALS, _context(request, filters))
