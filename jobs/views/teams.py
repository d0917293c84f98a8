from rest_framework import generics

from accounts.permissions import IsPerson
from jobs.admission import quota_usage

from ..serializers import TeamSerializer
from ..visibility import visible_teams


class TeamListView(generics.ListAPIView):
    """The caller's teams (all teams for operators), with quota usage."""

    permission_classes = [IsPerson]
    serializer_class = TeamSerializer

    def get_queryset(self):
        return visible_teams(self.request.user).prefetch_related(
            "members", "quotas__cluster", "quotas__team"
        )

    def get_serializer(self, *args, **kwargs):
        if kwargs.get("many"):  # a page of teams: their quotas' usage in one query
            quotas = [q for team in args[0] for q in team.quotas.all()]
            kwargs["context"] = {**self.get_serializer_context(),
                                 "quota_usage": quota_usage(quotas)}
        return super().get_serializer(*args, **kwargs)
