from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster
from frontend import charts, jobdetail, profiles, scoping
from jobs import services
from jobs.models import Phase
from jobs.recovery import budgets

from . import live

PAGE_SIZE = 50
HISTORY_PAGE = 50
LIST_PARTIALS = {"job-rows": "frontend/partials/job_rows.html"}
# Rendered on every poll: the status line (step, throughput) moves with each
# heartbeat.
STATUS_PARTIALS = {
    "job-status": "frontend/partials/job_status.html",
    "job-actions": "frontend/partials/job_actions.html",
}
DETAIL_PARTIALS = {
    **STATUS_PARTIALS,
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


def _status_context(request, job, newest) -> dict:
    """What the status line and the actions show: rendered on every poll."""
    return {
        "job": job,
        "can_act": scoping.can_act_on_job(request.user, job),
        # Attempts are numbered 1, 2, ... with none deleted while the job is.
        "attempt_count": newest.number if newest else 0,
        "interval": jobdetail.interval(job),
        "preflight": jobdetail.latest_preflight(job, newest),
    }


def _tables_context(request, job, newest) -> dict:
    """The status and the tables the live poll refreshes when they changed."""
    checkpoints = list(jobdetail.checkpoints(job))
    return {
        **_status_context(request, job, newest),
        # An ended job's checkpoints offer a rerun to whoever may ask one.
        "can_rerun": job.is_terminal and services.may_rerun(request.user, job),
        "attempts": list(jobdetail.attempts(job)),
        "checkpoints": checkpoints,
        "checkpoint_counts": jobdetail.checkpoint_counts(job, len(checkpoints)),
        "loadable": jobdetail.LOADABLE,
        "events": jobdetail.events(job),
        "evals": jobdetail.evals(job),
        "goodput": jobdetail.job_goodput(job),
        **profiles.context(job),
    }


def _detail_context(request, job):
    """The whole page: the tables, and what only the page itself shows."""
    newest = job.attempts.order_by("-number").first()
    return {
        **_tables_context(request, job, newest),
        "restarts": budgets.summary(job, timezone.now()),
        "preemptions": jobdetail.preemptions(job),
        "event_count": job.events.count(),
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
    """What an open job page asks every few seconds. It sends back the
    revision of the tables it shows and the key of the charts it drew:
    tables whose revision has not changed are not rendered again, nor are
    charts while the step and the revision stand still, so a poll that finds
    nothing new costs the job's row, one query of stamps, its newest attempt
    and the membership check."""
    job = scoping.job_for(request.user, pk)
    rev, newest = jobdetail.revision(job, timezone.now())
    changed = request.GET.get("rev") != rev
    charts_key = f"{job.current_step}.{rev}"
    extra = {"phase": job.phase, "terminal": job.is_terminal, "step": job.current_step,
             "rev": rev}
    # The page stops asking for charts once it has drawn a finished job.
    wants_charts = request.GET.get("charts", "1") != "0"
    if wants_charts and request.GET.get("charts_key") != charts_key:
        layer = request.GET.get("moe_layer", "")
        extra["charts"] = charts.chart_data(job, moe_layer=int(layer) if layer.isdigit()
                                            else None)
        extra["charts_key"] = charts_key
    if not changed:
        return live.fragments(request, STATUS_PARTIALS, _status_context(request, job, newest),
                              **extra)
    ctx = _tables_context(request, job, newest)
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
