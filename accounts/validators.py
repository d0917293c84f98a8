"""Input validators of the accounts API."""

from controlplane.lib.validation import StrictCharField, StrictSerializer


class TokenValidator(StrictSerializer):
    name = StrictCharField(min_length=1, max_length=100)
