"""Base of the worker endpoints: hit every few seconds by every rank, so they
parse plain JSON by hand (no serializer machinery) and touch few rows."""

from __future__ import annotations

from functools import cached_property

from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.views import APIView

from accounts.authentication import ApiTokenAuthentication
from jobs.models import JobAttempt
from jobs.worker_api.auth import IsAttemptWorker, WorkerTokenAuthentication
from jobs.worker_api.fields import JOB_ID, Fields, body_fields
from jobs.worker_api.tokens import Claim

__all__ = ["JOB_ID", "Fields", "WorkerView"]


class WorkerView(APIView):
    # People's authenticators stay listed so a person's token or session is
    # recognised and refused with 403, not mistaken for "no credentials".
    authentication_classes = [WorkerTokenAuthentication, ApiTokenAuthentication,
                              SessionAuthentication]
    permission_classes = [IsAttemptWorker]

    @property
    def claim(self) -> Claim:
        """The verified token's attempt, job and number (no database read)."""
        return self.request.auth

    @cached_property
    def attempt(self) -> JobAttempt:
        """The attempt's row, for the endpoints that need more than its ids
        (checkpoints, events): read once, on first use."""
        attempt = JobAttempt.objects.select_related("job").filter(
            pk=self.claim.attempt_id).first()
        if attempt is None:
            raise exceptions.AuthenticationFailed("Invalid worker token.")
        return attempt

    def body(self) -> dict:
        data = self.request.data
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        return data

    def fields(self, known: tuple[str, ...]) -> Fields:
        """The body's reader: refuses fields not in `known` (naming them) and
        a `job_id` that is not this attempt's job."""
        return body_fields(self.body(), known, self.claim.job_id, self.claim.attempt_id)
