from rest_framework import generics

from ..permissions import IsPerson, visible_jobs
from ..serializers import JobSerializer


class JobDetailView(generics.RetrieveAPIView):
    permission_classes = [IsPerson]
    serializer_class = JobSerializer

    def get_queryset(self):
        return visible_jobs(self.request.user).select_related("created_by")
