"""OpenAPI shapes of the worker endpoints. The views parse bodies by hand for
speed (jobs/worker_api/fields.py, views/fast.py); these serializers only
document them (docs/trainer-protocol.md). Both are made from the contract's
table of each body (regatta/contract.py), so the schema refuses what the
server refuses (tests/test_schemathesis.py). Each body may also name its
`job_id`, which must be the attempt's job."""

from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from regatta import contract
from rest_framework import serializers as s

from controlplane.lib.validation import StrictSerializer


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string"}], "nullable": True,
                      "description": "this attempt's job's id, if given"})
class JobIdField(s.Field):
    pass


def _field(field: contract.Field) -> s.Field:
    """One field as the reader takes it (jobs/worker_api/fields.py): an
    optional one also as null, a string untrimmed, a float finite."""
    optional = {} if field.required else {"required": False, "allow_null": True}
    common = {"help_text": field.meaning, **optional}
    if field is contract.JOB_ID_FIELD:
        return JobIdField(required=False)
    if field.type is int:
        return s.IntegerField(min_value=field.minimum, max_value=field.maximum, **common)
    if field.type is float:
        return s.FloatField(min_value=field.minimum, max_value=field.maximum, **common)
    if field.type is bool:
        return s.BooleanField(required=field.required, help_text=field.meaning)
    if field.type is dict:
        return s.DictField(**{**common, "required": False, "allow_null": True})
    if field.pattern:
        return s.RegexField(field.pattern, max_length=field.max_length, **common)
    return s.CharField(max_length=field.max_length, trim_whitespace=False,
                       allow_blank=field.min_length == 0, **common)


def _serializer(name: str, body: contract.Body, **given: s.Field) -> type[StrictSerializer]:
    """The body's serializer, named `name` in the schema; `given` fields
    (a list's items) as they are."""
    fields = {f.name: given.get(f.name) or _field(f) for f in body.fields}
    return type(name, (StrictSerializer,), {"__module__": __name__, **fields})


Directives = inline_serializer("Directives", {
    "checkpoint_request": s.CharField(allow_null=True),
    "stop": s.BooleanField(),
    "checkpoint_interval_steps": s.IntegerField(allow_null=True),
    "profile": inline_serializer("ProfileDirective", {
        "request_id": s.CharField(), "steps": s.IntegerField()}, allow_null=True),
})


Heartbeat = _serializer("Heartbeat", contract.HEARTBEAT)
MetricPointIn = _serializer("MetricPointIn", contract.METRIC_POINT)
MetricBatch = _serializer("MetricBatch", contract.METRIC_BATCH, points=s.ListField(
    child=MetricPointIn(), max_length=contract.METRIC_BATCH["points"].max_length,
    help_text=contract.METRIC_BATCH["points"].meaning))
CheckpointCommitted = _serializer("CheckpointCommitted", contract.CHECKPOINT)
TrainerEvent = _serializer("TrainerEvent", contract.EVENT)
ProfileTraceWritten = _serializer("ProfileTraceWritten", contract.PROFILE)


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
    }), 413: OpenApiResponse(description=f"More than {contract.MAX_BATCH} points, or a body "
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
