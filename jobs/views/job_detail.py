from rest_framework import generics

from accounts.permissions import IsPerson

from ..serializers import JobSerializer
from ..visibility import visible_jobs


class JobDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = JobSerializer

    def get_queryset(self):
        return visible_jobs(self.request.user).select_related("created_by")
