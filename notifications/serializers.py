"""Output serializers of the webhooks API. The secret appears once: in the
reply that creates the webhook."""

from rest_framework import serializers

from .models import Delivery, Webhook


class WebhookSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)

    class Meta:
        model = Webhook
        fields = ("id", "team", "url", "description", "events", "format", "active",
                  "secret_hint", "created_by", "created_at")
        read_only_fields = fields


class NewWebhookSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text=(
        "Signs every delivery (docs/notifications.md). Shown only now: keep it."))

    class Meta(WebhookSerializer.Meta):
        fields = (*WebhookSerializer.Meta.fields, "secret")
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = Delivery
        fields = ("id", "webhook", "event_type", "job_event", "status", "attempts",
                  "response_code", "last_error", "next_attempt_at", "created_at",
                  "last_attempt_at", "delivered_at", "history", "payload")
        read_only_fields = fields
