from django.shortcuts import get_object_or_404

from accounts.permissions import IsPerson
from jobs.visibility import visible_jobs


class JobScopedMixin:
    """Views under `jobs/<id>/`: the job must be visible to the caller, or it
    is not found (404), whether it exists or not."""

    permission_classes = [IsPerson]

    def get_job(self):
        if getattr(self, "swagger_fake_view", False):  # the schema generator has no job
            return None
        if not hasattr(self, "_job"):
            self._job = get_object_or_404(visible_jobs(self.request.user), pk=self.kwargs["pk"])
        return self._job
