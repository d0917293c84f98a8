from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from frontend import charts, jobdetail, profiles, scoping
from jobs import budgets, services
from jobs.models import Phase

from . import live

PAGE_SIZE = 50
HISTORY_PAGE = 50
LIST_PARTIALS = {"job-rows": "frontend/partials/job_rows.html"}
DETAIL_PARTIALS = {
    "job-status": "frontend/partials/job_status.html",
    "job-actions": "frontend/partials/job_actions.html",
    "job-attempts": "frontend/partials/job_attempts.html",
    "job-checkpoints": "frontend/partials/job_checkpoints.html",
    "job-events": "frontend/partials/job_events.html",
    "job-goodput": "frontend/partials/job_goodput.html",
    "job-profiles": "frontend/partials/job_profiles.html",
    "job-evals": "frontend/partials/job_evals.html",
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
    attempts = list(jobdetail.attempts(job))
    checkpoints = list(jobdetail.checkpoints(job))
    return {
        "job": job,
        "can_act": scoping.can_act_on_job(request.user, job),
        # An ended job's checkpoints offer a rerun to whoever may ask one.
        "can_rerun": job.is_terminal and services.may_rerun(request.user, job),
        "restarts": budgets.summary(job, timezone.now()),
        "attempts": attempts,
        "attempt_count": job.attempts.count(),
        "checkpoints": checkpoints,
        "checkpoint_counts": jobdetail.checkpoint_counts(job, len(checkpoints)),
        "loadable": jobdetail.LOADABLE,
        "events": jobdetail.events(job),
        "preemptions": jobdetail.preemptions(job),
        "evals": jobdetail.evals(job),
        "event_count": job.events.count(),
        "goodput": jobdetail.job_goodput(job),
        "interval": jobdetail.interval(job),
        "preflight": jobdetail.latest_preflight(job),
        **profiles.context(job),
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
        layer = request.GET.get("moe_layer", "")
        extra["charts"] = charts.chart_data(job, moe_layer=int(layer) if layer.isdigit()
                                            else None)
    ctx = _detail_context(request, job)
    extra["goodput"] = ctx["goodput"]["chart"]
    partials = DETAIL_PARTIALS
    if not (job.eval_policy or ctx["evals"]):
        # The page has no Evaluations section to refresh (job.html).
        partials = {k: v for k, v in partials.items() if k != "job-evals"}
    return live.fragments(request, partials, ctx, **extra)


def _history(request, pk: int, template: str, rows, name: str):
    """A job's whole record of one kind, paginated and not polled: the job
    page shows only the newest rows of each."""
    job = scoping.job_for(request.user, pk)
    page = Paginator(rows(job), HISTORY_PAGE).get_page(request.GET.get("page"))
    return render(request, template, {
        "job": job, "page": page, name: page.object_list,
        "can_act": scoping.can_act_on_job(request.user, job), "loadable": jobdetail.LOADABLE,
        "history": True,
    })


@login_required
def job_checkpoints(request, pk: int):
    return _history(request, pk, "frontend/job_checkpoints.html", jobdetail.all_checkpoints,
                    "checkpoints")


@login_required
def job_attempts(request, pk: int):
    return _history(request, pk, "frontend/job_attempts.html",
                    lambda job: jobdetail.attempts(job, limit=None), "attempts")
