"""Cancel, checkpoint now, profile the next steps, restart from a step: the same model methods the
API's job actions call, behind CSRF-protected form posts."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from controlplane.lib.errors import IllegalTransition
from controlplane.lib.tasks import enqueue_on_commit
from frontend import scoping
from jobs import services, tasks
from jobs.validators import ProfileRequestValidator, RestartValidator


def _job_to_act_on(request, pk):
    job = scoping.job_for(request.user, pk)
    if not scoping.can_act_on_job(request.user, job):
        raise Http404("No such job.")
    return job


def _back(job):
    return redirect("frontend:job", job.pk)


@login_required
@require_POST
def cancel(request, pk: int):
    job = _job_to_act_on(request, pk)
    try:
        if job.request_cancel(scoping.actor_for(request.user)):
            enqueue_on_commit(tasks.reconcile_job, job.pk)
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
    attempt = job.running_attempt()
    if attempt is None:
        messages.error(request, f"{job.name} has no running attempt to checkpoint.")
        return _back(job)
    try:
        attempt.request_checkpoint(scoping.actor_for(request.user))
    except IllegalTransition:
        messages.error(request, f"Attempt {attempt.number} stopped running; nothing to checkpoint.")
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
        for field, errors in body.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
        return _back(job)
    attempt = job.running_attempt()
    if attempt is None:
        messages.error(request, f"{job.name} is not running; only a running job is profiled.")
        return _back(job)
    if job.heartbeats_missing:
        messages.error(request, f"{job.name} sends no heartbeats, so it never gets the profile "
                                "directive; report through the regatta SDK.")
        return _back(job)
    try:
        _, created = attempt.request_profile(body.validated_data["steps"],
                                             scoping.actor_for(request.user))
    except IllegalTransition:
        messages.error(request, f"Attempt {attempt.number} stopped running; nothing to profile.")
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
    if job.is_terminal and not services.may_rerun(request.user, job):
        messages.error(request, f"Only the owner of {job.name} or an operator may rerun it.")
        return _back(job)
    if job.is_terminal and not services.can_resume(job):
        messages.error(request, f"{job.name} has ended ({job.phase}) with no checkpoint to "
                                "resume from; submit it again instead.")
        return _back(job)
    raw = request.POST.get("from_step", "")
    # A form posts text; the API's validator wants the JSON number it would get.
    body = RestartValidator(
        data={"from_step": int(raw) if raw.isdigit() else raw}, context={"job": job}
    )
    if not body.is_valid():
        for field, errors in body.errors.items():
            messages.error(request, f"{field}: {' '.join(str(e) for e in errors)}")
        return _back(job)
    step = body.validated_data["from_step"]
    ended = job.is_terminal
    try:
        if ended:
            services.rerun_job(job, step, request.user)
        else:
            job.request_restart(step, scoping.actor_for(request.user))
            enqueue_on_commit(tasks.reconcile_job, job.pk)
    except IllegalTransition:
        messages.error(request, f"{job.name} changed phase ({job.phase}); try again.")
        return _back(job)
    messages.success(request, f"{'Rerun' if ended else 'Restart'} from step {step} requested.")
    return _back(job)
