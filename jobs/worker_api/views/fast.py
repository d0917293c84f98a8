"""The two requests every rank sends every few seconds, a metric batch and a
heartbeat, answered ahead of Django's request stack when they are well formed.

Why: these are nearly all of the control plane's traffic (2,000 ranks are 400
heartbeats a second, before their metrics), and once the token became an
HMAC and a batch one statement, what was left of a batch of 10 was mostly
the request stack itself: nine middlewares, URL resolution, and DRF's
dispatch (authenticator and permission classes, content negotiation, the
parser, the renderer), about as long as the write it exists for.

What this does instead, in the WSGI callable (controlplane/wsgi.py): match
the two paths, read the body, check the token (an HMAC, no read), parse and
check the body (a metric batch decoded and checked against its schema in
one C pass by msgspec, a heartbeat by plain type tests), and call the same
writers the views call (jobs.metrics.ingest.store, jobs.worker_api.heartbeats.record).

One owner per answer: this path gives only the plain success of a well-formed
request with a valid current-format token and an allowed Host. Anything
else (no token, a legacy
token, a person's token, another attempt's token, a body that is not JSON of
the expected shape, a bad point, a string PostgreSQL cannot store, an ended
or deleted attempt, a database error) is handed on, body intact, to the full
stack (jobs/worker_api/views/metrics.py, heartbeat.py), which names the
problem exactly as it always has. Both writers are idempotent, and nothing
is handed on after a write has committed, so redoing a request there is safe.

Django's request_started and request_finished signals are sent around the
work as Django's own handler sends them: they are what closes an unusable
or expired database connection.
"""

from __future__ import annotations

import json
import math
import re
import sys
from io import BytesIO
from typing import Annotated, Any

import msgspec
from django.conf import settings
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from django.utils import timezone
from regatta import contract

from controlplane.lib import telemetry
from jobs.metrics import ingest
from jobs.worker_api import heartbeats
from jobs.worker_api import tokens as worker_tokens
from jobs.worker_api.heartbeats import Beat
from jobs.worker_api.views.base import JOB_ID

_PATH = re.compile(r"/api/v1/worker/attempts/([0-9]{1,18})/(metrics|heartbeat)\Z")
_JSON_TYPES = frozenset(("application/json", "application/json; charset=utf-8",
                         "application/json;charset=utf-8"))
# Only these escapes can put a NUL or a lone surrogate into a parsed string
# (controlplane/lib/parsers.py refuses those; the full stack names them).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
_BEAT_FIELDS = contract.HEARTBEAT.names
_BEAT_RANK, _BEAT_STEP = contract.HEARTBEAT["rank"], contract.HEARTBEAT["step"]
_BEAT_NODE = contract.HEARTBEAT["node"].max_length
_SCALARS = (str, int, float, bool, type(None))
_HEADERS = [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"), ("Referrer-Policy", "same-origin"),
            ("Cross-Origin-Opener-Policy", "same-origin")]


def _typed(field: contract.Field) -> Any:
    """A field's type with its bounds, as msgspec checks them: ints that
    are JSON integers (not floats, not booleans), floats that are finite
    (bounds that infinity fails; JSON has no NaN)."""
    if field.type is float:
        return Annotated[float, msgspec.Meta(
            ge=-sys.float_info.max if field.minimum is None else field.minimum,
            le=sys.float_info.max if field.maximum is None else field.maximum)]
    if field.type is int:
        return Annotated[int, msgspec.Meta(ge=field.minimum, le=field.maximum)]
    return Annotated[str, msgspec.Meta(min_length=field.min_length or None,
                                       max_length=field.max_length)]


def _struct(name: str, body: contract.Body, given: dict, **options) -> type[msgspec.Struct]:
    """A well-formed body, exactly as the contract's table has it (and so as
    the full stack's reader takes it); an optional field also as null or
    absent. `given`: fields typed here (a list's items, the job's id)."""
    fields = []
    for field in body.fields:
        kind = given.get(field.name) or _typed(field)
        fields.append((field.name, kind) if field.required else (field.name, kind | None, None))
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True, **options)


# A point exactly as jobs.metrics.ingest.point_ok has it.
_Point = _struct("_Point", contract.METRIC_POINT, {}, gc=False)
_MetricsBody = _struct("_MetricsBody", contract.METRIC_BATCH, {
    "points": Annotated[list[_Point], msgspec.Meta(
        max_length=contract.METRIC_BATCH["points"].max_length)],
    # Any other type is handed on (the full stack compares it to the token's job).
    JOB_ID: int | str,
})

_decode_metrics = msgspec.json.Decoder(_MetricsBody).decode


class _HandOn(Exception):
    """Not a plain success: the full stack answers this request."""


class WorkerFastPath:
    """WSGI middleware: the worker metric and heartbeat requests it can
    answer, answered; every other request passed to `app` untouched."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        match = (_PATH.match(environ.get("PATH_INFO", ""))
                 if environ.get("REQUEST_METHOD") == "POST" else None)
        if match is None or not _host_allowed(environ):
            return self.app(environ, start_response)
        body = _read_body(environ)
        if body is None:
            return self.app(environ, start_response)
        signals.request_started.send(sender=WSGIHandler, environ=environ)
        try:
            reply = _answer(environ, int(match[1]), match[2], body)
        except _HandOn:
            reply = None
        finally:
            signals.request_finished.send(sender=WSGIHandler)
        if reply is None:
            environ["wsgi.input"] = BytesIO(body)
            return self.app(environ, start_response)
        data = json.dumps(reply, cls=DjangoJSONEncoder, separators=(",", ":"),
                          ensure_ascii=False).encode()
        start_response("200 OK", [*_HEADERS, ("Content-Length", str(len(data)))])
        return [data]


def _host_allowed(environ) -> bool:
    """The Host header passes ALLOWED_HOSTS as Django checks it (a refused
    host is answered 400 by the full stack)."""
    host = settings.USE_X_FORWARDED_HOST and environ.get("HTTP_X_FORWARDED_HOST")
    domain, _ = split_domain_port(host or environ.get("HTTP_HOST", ""))
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _read_body(environ) -> bytes | None:
    """The JSON body, or None where the full stack must see the request
    unread: a content type it refuses (415), no length or one past the
    body limit (413)."""
    if environ.get("CONTENT_TYPE", "").lower() not in _JSON_TYPES:
        return None
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if not 0 < length <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
        return None
    body = environ["wsgi.input"].read(length)
    return body if len(body) == length else _short(environ, body)


def _short(environ, body: bytes) -> None:
    # The client sent less than it declared: the full stack reads what came.
    environ["wsgi.input"] = BytesIO(body)
    return None


def _answer(environ, attempt_id: int, endpoint: str, body: bytes) -> dict:
    claim = _claim(environ, attempt_id)
    if _SUSPECT_ESCAPE.search(body):
        raise _HandOn
    if endpoint == "metrics":
        return _metrics(claim, body)
    data = _parse(body)
    _same_job(claim, data.get(JOB_ID))
    return _heartbeat(claim, data)


def _same_job(claim: worker_tokens.Claim, job_id) -> None:
    if job_id is not None and job_id != "" and str(job_id) != str(claim.job_id):
        raise _HandOn


def _claim(environ, attempt_id: int) -> worker_tokens.Claim:
    scheme, _, raw = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    claim = worker_tokens.verify(raw) if scheme == "Bearer" and " " not in raw else None
    if claim is None or claim.attempt_id != attempt_id:
        raise _HandOn
    return claim


def _parse(body: bytes) -> dict:
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _HandOn from None
    if type(data) is not dict:
        raise _HandOn
    return data


def _refuse(constant: str):
    # NaN and Infinity are not JSON; the full stack's parser refuses them too.
    raise ValueError(constant)


def _metrics(claim: worker_tokens.Claim, body: bytes) -> dict:
    try:
        data = _decode_metrics(body)
    except (msgspec.MsgspecError, ValueError):  # UnicodeDecodeError is a ValueError
        raise _HandOn from None
    _same_job(claim, data.job_id)
    rows = [(p.rank, p.name, p.step, p.value, p.time) for p in data.points]
    try:
        stored = ingest.store(claim.job_id, claim.attempt_id, rows, received=len(rows))
    except (ingest.AttemptGone, DatabaseError):
        raise _HandOn from None
    telemetry.count_soon("metric_points_ingested", stored.new)
    return {"stored": stored.new, "duplicates": stored.duplicates}


def _heartbeat(claim: worker_tokens.Claim, data: dict) -> dict:
    rank, step, node, gpu = (data.get(k) for k in ("rank", "step", "node", "gpu"))
    rates = {key: data.get(key) for key in contract.PROGRESS}
    if (not data.keys() <= _BEAT_FIELDS
            or not (type(rank) is int and _BEAT_RANK.minimum <= rank <= _BEAT_RANK.maximum)
            or not (type(step) is int and _BEAT_STEP.minimum <= step <= _BEAT_STEP.maximum)
            or not (node is None or (type(node) is str and len(node) <= _BEAT_NODE))
            or not all(v is None or _non_negative(v) for v in rates.values())
            or not (gpu is None or _flat(gpu))):
        raise _HandOn
    beat = Beat(job_id=claim.job_id, attempt_id=claim.attempt_id, rank=rank, node=node or "",
                step=step, rates={k: None if v is None else float(v) for k, v in rates.items()},
                gpu=gpu)
    try:
        directives = heartbeats.record(beat, timezone.now())
    except DatabaseError:
        raise _HandOn from None
    if directives is None:
        raise _HandOn  # the attempt has ended or is gone: the full stack says which
    return {"directives": directives}


def _non_negative(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def _flat(gpu) -> bool:
    """A GPU reading as the trainer sends it: one object of finite scalars.
    Anything nested is left to the full stack's depth check."""
    return type(gpu) is dict and all(
        type(v) in _SCALARS and (type(v) is not float or math.isfinite(v))
        for v in gpu.values())
