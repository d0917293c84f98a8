from rest_framework import serializers

from .models import ApiToken


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ("id", "name", "prefix", "created_at", "last_used_at", "revoked_at")
        read_only_fields = fields


class NewApiTokenSerializer(ApiTokenSerializer):
    """Shown once, at creation: the raw token is never stored."""

    token = serializers.CharField(read_only=True)

    class Meta(ApiTokenSerializer.Meta):
        fields = (*ApiTokenSerializer.Meta.fields, "token")
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_operator = serializers.BooleanField()
    is_admin = serializers.BooleanField()
    teams = serializers.ListField(child=serializers.CharField())
