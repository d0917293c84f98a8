"""Input validators of the webhooks API: strict, every bad field named."""

from rest_framework import serializers

from accounts.permissions import acts_for_team
from controlplane.lib.validation import StrictBooleanField, StrictCharField, StrictSerializer
from jobs.models import Team

from . import targets
from .events import SUBSCRIBABLE
from .models import Webhook


class WebhookUpdateValidator(StrictSerializer):
    url = StrictCharField(max_length=2000)
    description = StrictCharField(max_length=200, allow_blank=True, required=False)
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=SUBSCRIBABLE), min_length=1, max_length=20,
        help_text="What to be sent: " + ", ".join(SUBSCRIBABLE),
    )
    format = serializers.ChoiceField(choices=Webhook.Format.choices, required=False)
    active = StrictBooleanField(required=False)

    def validate_url(self, value):
        try:
            targets.check(value)
        except targets.UnsafeTarget as exc:
            raise serializers.ValidationError(str(exc)) from None
        except OSError:
            pass  # DNS away now: each try checks again before it sends
        return value

    def validate_events(self, value):
        return sorted(set(value))


class WebhookValidator(WebhookUpdateValidator):
    team = StrictCharField(max_length=63)

    def validate_team(self, value):
        team = Team.objects.filter(name=value).first()
        user = self.context["request"].user
        if team is None or not acts_for_team(user, team):
            raise serializers.ValidationError(f"You are not a member of a team named {value!r}.")
        return team
