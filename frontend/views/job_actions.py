"""Cancel, checkpoint now, profile the next steps, restart from a step: the
services the API's job actions call (jobs/services.py), behind CSRF-protected
form posts."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from controlplane.lib.errors import IllegalTransition, NotAllowed, Refused
from frontend import scoping
from jobs import services
from jobs.profiling import requests as profile_requests
from jobs.validators import ProfileRequestValidator, RestartValidator


def _job_to_act_on(request, pk):
    job = scoping.job_for(request.user, pk)
    if not scoping.can_act_on_job(request.user, job):
        raise Http404("No such job.")
    return job


def _back(job):
    return redirect("frontend:job", job.pk)


def _refused(request, job, exc) -> None:
    """A state the ask cannot take, as the page says it."""
    if isinstance(exc, IllegalTransition):
        messages.error(request, f"{job.name} changed phase ({job.phase}); nothing to do.")
    else:
        messages.error(request, str(exc))


def _invalid(request, body) -> None:
    for field, errors in body.errors.items():
        messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")


@login_required
@require_POST
def cancel(request, pk: int):
    job = _job_to_act_on(request, pk)
    try:
        if services.cancel(job, request.user):
            messages.success(request, f"Cancel requested for {job.name}.")
        else:
            messages.info(request, f"{job.name} is already being cancelled.")
    except IllegalTransition:
        messages.error(request, f"{job.name} already ended ({job.phase}); nothing to cancel.")
    return _back(job)


@login_required
@require_POST
def checkpoint(request, pk: int):
    job = _job_to_act_on(request, pk)
    try:
        services.checkpoint_now(job, request.user)
    except (Refused, IllegalTransition) as exc:
        _refused(request, job, exc)
    else:
        messages.success(request, "Checkpoint requested; the trainer takes it at the next step.")
    return _back(job)


@login_required
@require_POST
def profile(request, pk: int):
    job = _job_to_act_on(request, pk)
    raw = request.POST.get("steps", "")
    body = ProfileRequestValidator(data={"steps": int(raw) if raw.isdigit() else raw})
    if not body.is_valid():
        _invalid(request, body)
        return _back(job)
    try:
        attempt, _, created = profile_requests.profile_next(job, body.validated_data["steps"],
                                                    request.user)
    except (Refused, IllegalTransition) as exc:
        _refused(request, job, exc)
        return _back(job)
    if created:
        messages.success(request, f"Profile of the next {attempt.profile_steps} steps "
                                  "requested; every rank writes a trace.")
    else:
        messages.info(request, "A profile is already under way; its traces appear below.")
    return _back(job)


@login_required
@require_POST
def restart(request, pk: int):
    """A live job restarts its gang from the step; an ended one runs again
    from it (its owner or an operator asks: jobs/services.py)."""
    job = _job_to_act_on(request, pk)
    try:
        services.check_may_restart(job, request.user)
    except (NotAllowed, Refused) as exc:
        messages.error(request, str(exc))
        return _back(job)
    raw = request.POST.get("from_step", "")
    # A form posts text; the API's validator wants the JSON number it would get.
    body = RestartValidator(
        data={"from_step": int(raw) if raw.isdigit() else raw}, context={"job": job}
    )
    if not body.is_valid():
        _invalid(request, body)
        return _back(job)
    step = body.validated_data["from_step"]
    try:
        done = services.restart(job, step, request.user)
    except (IllegalTransition, NotAllowed, Refused) as exc:
        _refused(request, job, exc)
        return _back(job)
    messages.success(request, f"{done.capitalize()} from step {step} requested.")
    return _back(job)
