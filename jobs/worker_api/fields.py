"""Reading a worker's JSON body field by field: shared by the worker
endpoints (jobs/views/worker_*.py) and by the collection of the reports a
rank could not deliver (jobs/worker_api/undelivered.py), so both refuse alike."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.lib.validation import finite_number

# Every worker body may say which job it is about (the trainer sends it);
# when it does, it must be this attempt's job.
JOB_ID = "job_id"


def body_fields(data: dict, known: tuple[str, ...], job_id, attempt_id) -> Fields:
    """A worker body's reader: refuses fields not in `known` (naming them)
    and a `job_id` that is not the attempt's job."""
    f = Fields(data, known=(*known, JOB_ID))
    sent = f.data.get(JOB_ID)
    if sent not in (None, "") and str(sent) != str(job_id):
        f.errors[JOB_ID] = [f"Attempt {attempt_id} belongs to job {job_id}."]
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
