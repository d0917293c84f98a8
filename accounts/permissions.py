"""Who may do what, as far as people and workers go.

Which team's objects a person sees is the owning app's (jobs/visibility.py);
these are the checks every API view shares.
"""

from rest_framework import permissions


def is_operator(user) -> bool:
    return bool(user and user.is_authenticated and (user.is_staff or user.is_superuser))


def acts_for_team(user, team) -> bool:
    """The one membership rule: a person acts for a team (submits its jobs,
    acts on them, keeps its webhooks) as one of its members, or as an
    operator, who acts for every team. `team` is any object with `members`
    (jobs.Team; accounts imports no app)."""
    return is_operator(user) or team.members.filter(pk=user.pk).exists()


def actor_for(user) -> str:
    """How a person is named on timelines."""
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
