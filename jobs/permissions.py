"""Who may see and act on what.

A team member sees only the team's jobs; operators (staff) see everything.
Another team's job is not hidden behind a 403 but simply not found (404), so
its existence does not leak.
"""

from rest_framework import permissions

from .models import Team, TrainingJob


def is_operator(user) -> bool:
    return bool(user and user.is_authenticated and (user.is_staff or user.is_superuser))


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


def actor_for(user) -> str:
    return f"user:{user.get_username()}"


class IsOperator(permissions.BasePermission):
    message = "Only operators may do this."

    def has_permission(self, request, view):
        return is_operator(request.user)


class IsPerson(permissions.IsAuthenticated):
    """An authenticated person: a worker token never passes."""

    def has_permission(self, request, view):
        return super().has_permission(request, view) and not getattr(
            request.user, "is_worker", False
        )


class ReadOrAdmin(permissions.BasePermission):
    """Any person reads; only superusers (admins) write."""

    message = "Only admins may change quotas."

    def has_permission(self, request, view):
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(request.user and request.user.is_superuser)
