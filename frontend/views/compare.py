"""The comparison page: `/compare/?jobs=12,15&metric=loss&x=step`.

The URL is the whole state, so it can be shared: a picker's form (repeated
`jobs=`) is redirected to the one comma-separated spelling. The data are
jobs.metrics.compare's, the same as `GET /api/v1/jobs/compare/`."""

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode

from frontend import scoping
from jobs.metrics import compare
from jobs.metrics.series import DEFAULT_POINTS

PICKER_JOBS = 50
MAX_METRIC = 64


def _picker(user):
    """The newest jobs the viewer may see, to tick."""
    return scoping.visible_jobs(user).order_by("-created_at", "-id")[:PICKER_JOBS]


def _canonical(request, ids: list[int]):
    """Where a request spelled other than `jobs=1,2` goes, or None."""
    raw = request.GET.getlist("jobs")
    if len(raw) <= 1:
        return None
    query = {"jobs": ",".join(map(str, ids))}
    for key in ("metric", "x"):
        if request.GET.get(key):
            query[key] = request.GET[key]
    return redirect(reverse("frontend:compare") + "?" + urlencode(query))


def _refused(request, error: str, field: str):
    ctx = {"error": error, "field": field, "picker": _picker(request.user), "x": "step",
           "job_ids": request.GET.get("jobs", "")}
    return render(request, "frontend/compare.html", ctx, status=400)


def _render(request, ids: list[int], metric: str, x: str):
    try:
        jobs = compare.scoped_jobs(request.user, ids)
    except compare.JobsNotFound as exc:
        raise Http404(str(exc)) from None
    names = compare.metric_names(jobs)
    comparison = compare.Comparison(jobs, metric or compare.default_metric(names), x,
                                    DEFAULT_POINTS).as_dict()
    chart = {"metric": comparison["metric"], "x": x,
             "jobs": [{"id": j["id"], "name": j["name"], "x": j["x"], "y": j["y"]}
                      for j in comparison["jobs"]]}
    rows = [{**row, "shown": [_cell(v) for v in row["values"]]} for row in comparison["params"]]
    return render(request, "frontend/compare.html", {
        "jobs": comparison["jobs"], "metric": comparison["metric"], "metrics": names, "x": x,
        "chart": chart, "params": rows, "differing": sum(r["differs"] for r in rows),
        "job_ids": ",".join(map(str, ids)), "picker": _picker(request.user),
        "chosen": set(ids),
    })


def _cell(value) -> str:
    if value is None:
        return "—"
    return value if isinstance(value, str) else json.dumps(value)


@login_required
def compare_jobs(request):
    if not any(v.strip() for v in request.GET.getlist("jobs")):
        return render(request, "frontend/compare.html", {
            "picker": _picker(request.user), "x": "step", "job_ids": ""})
    try:
        ids = compare.parse_job_ids(request.GET.getlist("jobs"))
    except ValueError as exc:
        return _refused(request, str(exc), "jobs")
    x = request.GET.get("x") or "step"
    if x not in compare.X_AXES:
        return _refused(request, f"x must be one of {', '.join(compare.X_AXES)}.", "x")
    metric = request.GET.get("metric", "")
    if len(metric) > MAX_METRIC:
        return _refused(request, f"A metric name has at most {MAX_METRIC} characters.",
                        "metric")
    return _canonical(request, ids) or _render(request, ids, metric, x)
