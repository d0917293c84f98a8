"""Reading a worker's JSON body field by field, by the contract's table of
that body (regatta/contract.py): shared by the worker endpoints
(jobs/worker_api/views/) and by the collection of the reports a rank could
not deliver (jobs/worker_api/undelivered.py), so both refuse alike."""

from __future__ import annotations

import copy
import re

from regatta import contract
from rest_framework import serializers

from controlplane.lib.validation import finite_number

# Every worker body may say which job it is about (the trainer sends it);
# when it does, it must be this attempt's job.
JOB_ID = contract.JOB_ID_FIELD.name


def body_fields(data: dict, known, job_id, attempt_id) -> Fields:
    """A worker body's reader: refuses fields not in `known` (names, or a
    contract.Body) and a `job_id` that is not the attempt's job."""
    if isinstance(known, contract.Body):
        known = tuple(known.names)
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

    def read(self, body: contract.Body) -> dict:
        """Every field of `body` but `job_id` (body_fields checks that), each
        by its type and bounds in the table: its value, or the table's
        default where it is absent, null or wrong (then with its error)."""
        return {field.name: self.field(field) for field in body.fields
                if field is not contract.JOB_ID_FIELD}

    def field(self, field: contract.Field):
        readers = {int: self._read_int, float: self._read_number, str: self._read_str,
                   bool: self._read_bool, dict: self._read_dict, list: self._read_list}
        return readers[field.type](field)

    def _read_int(self, field):
        return self.int(field.name, required=field.required, default=field.default,
                        minimum=field.minimum, maximum=field.maximum)

    def _read_number(self, field):
        value = self.number(field.name, required=field.required, minimum=field.minimum)
        if value is not None and field.maximum is not None and value > field.maximum:
            self._err(field.name, f"Must be between {field.minimum or 0:g} and "
                                  f"{field.maximum:.0f}.")
            return field.default
        return field.default if value is None else value

    def _read_str(self, field):
        value = self.str(field.name, required=field.required, max_length=field.max_length,
                         default=field.default)
        if f"{self.prefix}{field.name}" in self.errors:
            return value
        if len(value) < field.min_length:
            self._err(field.name, "Must not be blank.")
        elif field.pattern and not re.match(field.pattern, value):
            self._err(field.name, f"Must be {field.meaning}.")
        return value

    def _read_bool(self, field):
        return self.bool(field.name, default=field.default)

    def _read_dict(self, field):
        value = self.data.get(field.name)
        if value is None:
            return copy.deepcopy(field.default)
        if not isinstance(value, dict):
            self._err(field.name, "A JSON object or null is required."
                      if field.default is None else "A JSON object is required.")
            return copy.deepcopy(field.default)
        return value

    def _read_list(self, field):
        value = self.data.get(field.name)
        if not isinstance(value, list):
            self._err(field.name, "A list is required.")
            return []
        return value
