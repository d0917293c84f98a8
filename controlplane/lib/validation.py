"""Strict request validation shared by every app's validators.

Every validator is strict: unknown fields are named and refused, numbers must
be JSON numbers (not "2", not true), and one reply names every bad field.
"""

import math

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import SkipField, empty, get_error_detail
from rest_framework.serializers import as_serializer_error


class StrictIntegerField(serializers.IntegerField):
    """DRF's IntegerField takes "2" and true; a spec must say 2."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        return super().to_internal_value(int(data))


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, naming them, and names every problem
    in one reply: the unknown fields, each field's own errors, and whatever
    the checks across fields (`validate`) find among the fields that passed.
    So `validate` gets only the fields that are valid, and skips each check
    whose inputs are missing."""

    def run_validation(self, data=empty):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Expected a JSON object."]}
            )
        errors = {name: ["Unknown field."] for name in sorted(set(data) - set(self.fields))}
        attrs = self._valid_fields(data, errors)
        try:
            self.run_validators(attrs)
            attrs = self.validate(attrs)
        except (serializers.ValidationError, DjangoValidationError) as exc:
            for name, messages in as_serializer_error(exc).items():
                errors.setdefault(name, messages)  # a field's own error says more
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _valid_fields(self, data: dict, errors: dict) -> dict:
        """DRF's per-field loop (Serializer.to_internal_value), keeping the
        valid values when others fail instead of throwing them all away."""
        attrs = {}
        for field in self._writable_fields:
            validate_method = getattr(self, "validate_" + field.field_name, None)
            try:
                value = field.run_validation(field.get_value(data))
                if validate_method is not None:
                    value = validate_method(value)
            except serializers.ValidationError as exc:
                errors[field.field_name] = exc.detail
            except DjangoValidationError as exc:
                errors[field.field_name] = get_error_detail(exc)
            except SkipField:
                pass
            else:
                self.set_value(attrs, field.source_attrs, value)
        return attrs


def finite_number(value) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
