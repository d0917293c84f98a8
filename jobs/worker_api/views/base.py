"""Base of the worker endpoints: hit every few seconds by every rank, so they
parse plain JSON by hand (no serializer machinery) and touch few rows."""

from __future__ import annotations

from functools import cached_property

from rest_framework import exceptions, serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.views import APIView

from accounts.authentication import ApiTokenAuthentication
from controlplane.lib.validation import finite_number
from jobs.models import JobAttempt
from jobs.worker_api.auth import IsAttemptWorker, WorkerTokenAuthentication
from jobs.worker_api.tokens import Claim

# Every worker body may say which job it is about (the trainer sends it);
# when it does, it must be this attempt's job.
JOB_ID = "job_id"


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
        f = Fields(self.body(), known=(*known, JOB_ID))
        job_id = f.data.get(JOB_ID)
        claim = self.claim
        if job_id not in (None, "") and str(job_id) != str(claim.job_id):
            f.errors[JOB_ID] = [f"Attempt {claim.attempt_id} belongs to job {claim.job_id}."]
        return f


class Fields:
    """Collects field errors while reading a JSON object; with `known`, a
    field outside it is an error too, so one reply names every problem."""

    def __init__(self, data: dict, prefix: str = "", *, known: tuple[str, ...] | None = None):
        self.data, self.prefix, self.errors = data, prefix, {}
        for key in sorted(set(data) - set(known)) if known is not None else ():
            self._err(key, "Unknown field.")

    def _err(self, key, message):
        self.errors[f"{self.prefix}{key}"] = [message]

    def int(self, key, *, required=True, default=None, minimum=0, maximum=2**31 - 1):
        value = self.data.get(key, default)
        if value is None and not required:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self._err(key, "An integer is required.")
            return None
        if not minimum <= value <= maximum:
            self._err(key, f"Must be between {minimum} and {maximum}.")
            return None
        return value

    def number(self, key, *, required=False, minimum=None):
        value = self.data.get(key)
        if value is None:
            if required:
                self._err(key, "A number is required.")
            return None
        if not finite_number(value):
            self._err(key, "A finite number is required.")
            return None
        if minimum is not None and value < minimum:
            self._err(key, f"Must be at least {minimum}.")
            return None
        return float(value)

    def str(self, key, *, required=False, max_length=300, default=""):
        value = self.data.get(key)
        if value is None:
            if required:
                self._err(key, "This field is required.")
            return default
        if not isinstance(value, str) or len(value) > max_length:
            self._err(key, f"A string of at most {max_length} characters is required.")
            return default
        return value

    def bool(self, key, default=False):
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self._err(key, "A boolean is required.")
            return default
        return value

    def dict(self, key):
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self._err(key, "A JSON object is required.")
            return {}
        return value

    def check(self):
        if self.errors:
            raise serializers.ValidationError(self.errors)
