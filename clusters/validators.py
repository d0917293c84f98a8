"""Input validators of the fleet's actions."""

from rest_framework import serializers

from controlplane.lib.validation import StrictCharField, StrictSerializer

from .providers.base import FaultKind


class ReasonValidator(StrictSerializer):
    reason = StrictCharField(required=False, max_length=250, allow_blank=True)


class FaultValidator(StrictSerializer):
    kind = serializers.ChoiceField(choices=list(FaultKind.ALL))
