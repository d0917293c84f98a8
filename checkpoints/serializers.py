from rest_framework import serializers

from .models import Checkpoint, ModelArtifact


class CheckpointSerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="job_id", read_only=True)
    attempt = serializers.IntegerField(source="attempt_id", read_only=True, allow_null=True)
    loadable = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ("id", "job", "attempt", "step", "uri", "bytes", "manifest_sha256", "state",
                  "state_reason", "loadable", "save_seconds", "blocking_seconds", "emergency",
                  "request_id", "created_at", "verified_at")
        read_only_fields = fields

    def get_loadable(self, checkpoint) -> bool:
        return checkpoint.state in Checkpoint.LOADABLE


class ModelArtifactSerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="job_id", read_only=True)
    checkpoint = serializers.IntegerField(source="checkpoint_id", read_only=True,
                                          allow_null=True)

    class Meta:
        model = ModelArtifact
        fields = ("id", "job", "checkpoint", "name", "version", "uri", "bytes", "sha256",
                  "format", "config", "created_at")
        read_only_fields = fields
