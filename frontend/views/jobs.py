from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.urls import reverse

from clusters.models import Cluster
from frontend import charts, jobdetail, scoping
from jobs.models import Phase

from . import live

PAGE_SIZE = 50
LIST_PARTIALS = {"job-rows": "frontend/partials/job_rows.html"}
DETAIL_PARTIALS = {
    "job-status": "frontend/partials/job_status.html",
    "job-actions": "frontend/partials/job_actions.html",
    "job-attempts": "frontend/partials/job_attempts.html",
    "job-checkpoints": "frontend/partials/job_checkpoints.html",
    "job-events": "frontend/partials/job_events.html",
    "job-goodput": "frontend/partials/job_goodput.html",
}


def _list_context(request):
    jobs = scoping.visible_jobs(request.user)
    filters = {k: request.GET.get(k, "") for k in ("team", "phase", "cluster")}
    if filters["team"]:
        jobs = jobs.filter(team__name=filters["team"])
    if filters["phase"]:
        jobs = jobs.filter(phase=filters["phase"])
    if filters["cluster"]:
        jobs = jobs.filter(cluster__name=filters["cluster"])
    page = Paginator(jobs.order_by("-created_at", "-id"), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return {
        "page": page,
        "jobs": page.object_list,
        "filters": filters,
        "teams": scoping.visible_teams(request.user),
        "clusters": Cluster.objects.all(),
        "phases": Phase.values,
        "query": request.GET.urlencode(),
    }


@login_required
def job_list(request):
    ctx = _list_context(request)
    url = reverse("frontend:jobs-live") + (f"?{ctx['query']}" if ctx["query"] else "")
    return live.page(request, "frontend/jobs.html", ctx, url)


@login_required
def job_list_live(request):
    return live.fragments(request, LIST_PARTIALS, _list_context(request))


def _detail_context(request, job):
    return {
        "job": job,
        "can_act": scoping.can_act_on_job(request.user, job),
        "attempts": jobdetail.attempts(job),
        "checkpoints": jobdetail.checkpoints(job),
        "restartable": set(jobdetail.restartable_steps(job)),
        "events": jobdetail.events(job),
        "goodput": jobdetail.job_goodput(job),
        "interval": jobdetail.interval(job),
        "preflight": jobdetail.latest_preflight(job),
    }


@login_required
def job_detail(request, pk: int):
    job = scoping.job_for(request.user, pk)
    # The series come with the first live fetch, right after the page loads,
    # so the page itself opens as fast for a million points as for ten.
    ctx = _detail_context(request, job)
    return live.page(request, "frontend/job.html", ctx, reverse("frontend:job-live", args=[pk]))


@login_required
def job_live(request, pk: int):
    job = scoping.job_for(request.user, pk)
    extra = {"phase": job.phase, "terminal": job.is_terminal, "step": job.current_step}
    # The page stops asking for charts once it has drawn a finished job.
    if request.GET.get("charts", "1") != "0":
        extra["charts"] = charts.chart_data(job)
    extra["goodput"] = jobdetail.job_goodput(job)
    return live.fragments(request, DETAIL_PARTIALS, _detail_context(request, job), **extra)
