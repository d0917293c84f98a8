"""OpenAPI shapes of the worker endpoints. The views parse bodies by hand for
speed; these serializers only document them (docs/trainer-protocol.md)."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers as s

Directives = inline_serializer("Directives", {
    "checkpoint_request": s.CharField(allow_null=True),
    "stop": s.BooleanField(),
    "checkpoint_interval_steps": s.IntegerField(allow_null=True),
    "profile": inline_serializer("ProfileDirective", {
        "request_id": s.CharField(), "steps": s.IntegerField()}, allow_null=True),
})

heartbeat = extend_schema(
    tags=["worker"],
    request=inline_serializer("Heartbeat", {
        "rank": s.IntegerField(), "node": s.CharField(), "step": s.IntegerField(),
        "samples_per_s": s.FloatField(required=False), "tokens_per_s": s.FloatField(
            required=False), "step_time_s": s.FloatField(required=False),
        "gpu": s.DictField(allow_null=True, required=False),
    }),
    responses={200: inline_serializer("HeartbeatReply", {"directives": Directives}),
               403: inline_serializer("HeartbeatStop", {"detail": s.CharField(),
                                                        "stop": s.BooleanField()})},
)

metrics = extend_schema(
    tags=["worker"],
    request=inline_serializer("MetricBatch", {
        "batch_id": s.CharField(required=False),
        "points": s.ListField(child=inline_serializer("MetricPointIn", {
            "rank": s.IntegerField(), "name": s.CharField(), "step": s.IntegerField(),
            "value": s.FloatField(), "time": s.FloatField(required=False)}), max_length=5000),
    }),
    responses={200: inline_serializer("MetricBatchReply", {
        "stored": s.IntegerField(help_text="points new to the store"),
        "duplicates": s.IntegerField(help_text="points already stored by an earlier send"),
    })},
)

checkpoints = extend_schema(
    tags=["worker"],
    request=inline_serializer("CheckpointCommitted", {
        "step": s.IntegerField(), "uri": s.CharField(), "bytes": s.IntegerField(),
        "manifest_sha256": s.CharField(), "save_seconds": s.FloatField(),
        "blocking_seconds": s.FloatField(), "emergency": s.BooleanField(),
        "request_id": s.CharField(allow_null=True),
    }),
    responses={201: inline_serializer("CheckpointCommittedReply", {
        "checkpoint": s.IntegerField(), "step": s.IntegerField(), "created": s.BooleanField()})},
)

events = extend_schema(
    tags=["worker"],
    request=inline_serializer("TrainerEvent", {
        "kind": s.CharField(), "rank": s.IntegerField(), "message": s.CharField(required=False),
        "data": s.DictField(required=False), "node": s.CharField(required=False),
        "key": s.CharField(required=False, max_length=100,
                           help_text="the rank's name for this event: stored once per key"),
    }),
    responses={201: inline_serializer("TrainerEventReply", {"event": s.IntegerField()}),
               200: inline_serializer("TrainerEventRepeated", {"event": s.IntegerField()})},
)

profiles = extend_schema(
    tags=["worker"],
    request=inline_serializer("ProfileTraceWritten", {
        "request_id": s.CharField(), "rank": s.IntegerField(), "start_step": s.IntegerField(),
        "steps": s.IntegerField(), "uri": s.CharField(), "bytes": s.IntegerField(),
    }),
    responses={201: inline_serializer("ProfileTraceWrittenReply", {
        "trace": s.IntegerField(), "created": s.BooleanField()})},
)
