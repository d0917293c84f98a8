"""Who may see and act on what: the API's rules (accounts.permissions, jobs.visibility), plus the
404-not-403 lookups the pages need."""

from django.http import Http404

from accounts.permissions import actor_for, acts_for_team, is_operator
from jobs.models import Team, TrainingJob
from jobs.visibility import visible_jobs, visible_teams

__all__ = ["actor_for", "is_operator", "visible_jobs", "visible_teams", "job_for", "team_for",
           "can_act_on_job"]


def job_for(user, pk: int) -> TrainingJob:
    """Another team's job is simply not found, so its existence does not leak."""
    # Team and cluster come along: every job page shows their names.
    job = visible_jobs(user).filter(pk=pk).select_related("team", "cluster").first()
    if job is None:
        raise Http404("No such job.")
    return job


def team_for(user, name: str) -> Team:
    team = visible_teams(user).filter(name=name).first()
    if team is None:
        raise Http404("No such team.")
    return team


def can_act_on_job(user, job: TrainingJob) -> bool:
    """Owner, teammate or operator: the job's team members and staff."""
    return acts_for_team(user, job.team)
