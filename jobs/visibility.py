"""Which teams and jobs a person sees.

A team member sees only the team's jobs; operators (staff) see everything.
Another team's job is not hidden behind a 403 but simply not found (404), so
its existence does not leak.
"""

from accounts.permissions import is_operator

from .models import Team, TrainingJob


def visible_teams(user):
    if not (user and user.is_authenticated and user.pk):
        return Team.objects.none()
    if is_operator(user):
        return Team.objects.all()
    return Team.objects.filter(members=user)


def visible_jobs(user):
    jobs = TrainingJob.objects.select_related("team", "cluster", "pool")
    if not (user and user.is_authenticated and user.pk):
        return jobs.none()
    if is_operator(user):
        return jobs
    return jobs.filter(team__in=Team.objects.filter(members=user).values("pk"))
