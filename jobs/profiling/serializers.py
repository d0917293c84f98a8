"""A rank's profiler trace as the API lists it."""

from django.urls import reverse
from rest_framework import serializers

from jobs.profiling.models import ProfileTrace


class ProfileTraceSerializer(serializers.ModelSerializer):
    """One rank's profiler trace; `url` downloads it (gzipped Chrome JSON)."""

    url = serializers.SerializerMethodField()

    class Meta:
        model = ProfileTrace
        fields = ("id", "attempt", "request_id", "rank", "start_step", "steps", "path", "bytes",
                  "created_at", "url")

    def get_url(self, obj) -> str:
        path = reverse("jobs:job-profile-trace", args=[obj.job_id, obj.pk])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path
