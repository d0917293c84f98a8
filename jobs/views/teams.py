from rest_framework import generics

from ..permissions import IsPerson, visible_teams
from ..serializers import TeamSerializer


class TeamListView(generics.ListAPIView):
    """The caller's teams (all teams for operators), with quota usage."""

    permission_classes = [IsPerson]
    serializer_class = TeamSerializer

    def get_queryset(self):
        return visible_teams(self.request.user).prefetch_related(
            "members", "quotas__cluster", "quotas__team"
        )
