"""OpenAPI shapes of the worker endpoints. The views parse bodies by hand for
speed (jobs/worker_api/fields.py, views/fast.py); these serializers only
document them (docs/trainer-protocol.md), with the bounds those parsers
enforce, so the schema refuses what the server refuses
(tests/test_schemathesis.py). Each body may also name its `job_id`, which
must be the attempt's job."""

from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers as s

from controlplane.lib.validation import StrictSerializer
from jobs.metrics import ingest
from jobs.profiling import MAX_PROFILE_STEPS
from jobs.worker_api.heartbeats import PROGRESS_KEYS
from jobs.worker_api.reports import KIND

INT = 2**31 - 1  # fields.Fields.int's bound unless a field says otherwise
MAX_RANK = 65535


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string"}], "nullable": True,
                      "description": "this attempt's job's id, if given"})
class JobIdField(s.Field):
    pass


def _job_id():
    return JobIdField(required=False)


def _text(max_length: int, **kw):
    """An optional string the parser takes blank or null."""
    return s.CharField(max_length=max_length, required=False, allow_blank=True,
                       allow_null=True, trim_whitespace=False, **kw)


Directives = inline_serializer("Directives", {
    "checkpoint_request": s.CharField(allow_null=True),
    "stop": s.BooleanField(),
    "checkpoint_interval_steps": s.IntegerField(allow_null=True),
    "profile": inline_serializer("ProfileDirective", {
        "request_id": s.CharField(), "steps": s.IntegerField()}, allow_null=True),
})


class Heartbeat(StrictSerializer):
    rank = s.IntegerField(min_value=0, max_value=MAX_RANK)
    node = _text(253)
    step = s.IntegerField(min_value=0, max_value=INT)
    gpu = s.DictField(allow_null=True, required=False)
    job_id = _job_id()

    def get_fields(self):
        fields = super().get_fields()
        for key in PROGRESS_KEYS:
            fields[key] = s.FloatField(min_value=0, required=False, allow_null=True)
        return fields


class MetricPointIn(StrictSerializer):
    rank = s.IntegerField(min_value=0, max_value=ingest.MAX_RANK)
    name = s.CharField(max_length=ingest.MAX_NAME, trim_whitespace=False)
    step = s.IntegerField(min_value=0, max_value=ingest.MAX_STEP)
    value = s.FloatField()
    time = s.FloatField(min_value=0, max_value=ingest.MAX_TIME, required=False,
                        allow_null=True)


class MetricBatch(StrictSerializer):
    batch_id = _text(100)
    points = s.ListField(child=MetricPointIn(), max_length=ingest.MAX_BATCH)
    job_id = _job_id()


class CheckpointCommitted(StrictSerializer):
    step = s.IntegerField(min_value=0, max_value=INT)
    uri = s.CharField(max_length=1000, trim_whitespace=False,
                      help_text="this job's own step-<step> folder, as its storage spells it")
    bytes = s.IntegerField(min_value=0, max_value=2**62, required=False, allow_null=True)
    manifest_sha256 = _text(64)
    save_seconds = s.FloatField(min_value=0, required=False, allow_null=True)
    blocking_seconds = s.FloatField(min_value=0, required=False, allow_null=True)
    emergency = s.BooleanField(required=False)
    request_id = _text(64)
    job_id = _job_id()


class TrainerEvent(StrictSerializer):
    kind = s.RegexField(KIND.pattern, max_length=41, help_text="snake_case, e.g. started")
    rank = s.IntegerField(min_value=0, max_value=MAX_RANK, required=False, allow_null=True)
    message = _text(10_000)
    data = s.DictField(required=False, allow_null=True)
    node = _text(253)
    key = _text(100, help_text="the rank's name for this event: stored once per key")
    job_id = _job_id()


class ProfileTraceWritten(StrictSerializer):
    request_id = s.CharField(max_length=64, trim_whitespace=False, allow_blank=True,
                             help_text="a profile this attempt was asked for")
    rank = s.IntegerField(min_value=0, max_value=MAX_RANK,
                          help_text="a rank of the gang (below its world size)")
    start_step = s.IntegerField(min_value=0, max_value=INT)
    steps = s.IntegerField(min_value=0, max_value=MAX_PROFILE_STEPS)
    uri = s.CharField(max_length=1000, trim_whitespace=False, allow_blank=True,
                      help_text="this job's own trace file, as its storage spells it")
    bytes = s.IntegerField(min_value=0, max_value=2**62, required=False, allow_null=True)
    job_id = _job_id()


heartbeat = extend_schema(
    tags=["worker"],
    request=Heartbeat,
    responses={200: inline_serializer("HeartbeatReply", {"directives": Directives}),
               403: inline_serializer("HeartbeatStop", {"detail": s.CharField(),
                                                        "stop": s.BooleanField()})},
)

metrics = extend_schema(
    tags=["worker"],
    request=MetricBatch,
    responses={200: inline_serializer("MetricBatchReply", {
        "stored": s.IntegerField(help_text="points new to the store"),
        "duplicates": s.IntegerField(help_text="points already stored by an earlier send"),
    }), 413: OpenApiResponse(description=f"More than {ingest.MAX_BATCH} points, or a body "
                                         "past REGATTA_MAX_BODY_BYTES.")},
)

checkpoints = extend_schema(
    tags=["worker"],
    request=CheckpointCommitted,
    responses={201: inline_serializer("CheckpointCommittedReply", {
        "checkpoint": s.IntegerField(), "step": s.IntegerField(), "created": s.BooleanField()})},
)

events = extend_schema(
    tags=["worker"],
    request=TrainerEvent,
    responses={201: inline_serializer("TrainerEventReply", {"event": s.IntegerField()}),
               200: inline_serializer("TrainerEventRepeated", {"event": s.IntegerField()})},
)

profiles = extend_schema(
    tags=["worker"],
    request=ProfileTraceWritten,
    responses={201: inline_serializer("ProfileTraceWrittenReply", {
        "trace": s.IntegerField(), "created": s.BooleanField()})},
)
