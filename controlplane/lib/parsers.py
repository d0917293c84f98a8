"""API request bodies: JSON only, and never past REGATTA_MAX_BODY_BYTES
(settings.DATA_UPLOAD_MAX_MEMORY_SIZE), nested at most MAX_JSON_DEPTH deep,
and with no string (key or value, at any depth) that PostgreSQL cannot store:
a NUL character or an unpaired UTF-16 surrogate. Every endpoint parses with
`BoundedJSONParser`, so each answers such a body with one 400 naming every
bad place at once, before a view sees it.

The size is checked twice. `ApiBodyLimitMiddleware` answers 413 from the
declared Content-Length before any view runs, whatever the content type: DRF
picks a parser (and answers 415 to anything but JSON) only once a view reads
`request.data`. `BoundedJSONParser` reads through `HttpRequest.body`, which
applies Django's own check (RequestDataTooBig → 413, see controlplane.lib.api),
because DRF hands parsers the raw stream, which skips it.
"""

import io
import logging
import math
import re

import numpy as np
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpResponse, JsonResponse
from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

log = logging.getLogger(__name__)

API_PREFIX = "/api/"
# Deeper than any body the API takes (hyperparameters, event data); and far
# below Python's recursion limit, which a deeper body would otherwise hit.
MAX_JSON_DEPTH = 32
# Only these escapes can put a NUL or a lone surrogate into a parsed string:
# raw control characters and invalid UTF-8 are refused by the JSON parser.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
BAD_STRING = "Must not contain NUL characters or unpaired surrogates (\\u0000, \\ud800-\\udfff)."
# A number this long or with an exponent this large may overflow a double to
# infinity (1e999), which JSON columns cannot store; only then are floats checked.
# The lookbehind starts a match only where a run of digits starts: without
# it the search retried 300 digits from every digit of a body of numbers.
_SUSPECT_NUMBER = re.compile(rb"(?<!\d)\d{300}|[eE]\+?\d{3}")
BAD_NUMBER = "A finite number is required (this one overflows)."


def too_large_detail() -> str:
    return f"Request body too large: at most {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."


def too_deep_detail() -> str:
    return f"JSON nested too deeply: at most {MAX_JSON_DEPTH} levels of objects and lists."


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        django_request = getattr(request, "_request", None)
        if django_request is not None and not django_request._read_started:
            body = django_request.body
        else:
            body = stream.read() if stream is not None else b""
        try:
            data = super().parse(io.BytesIO(body), media_type, parser_context)
        except RecursionError:
            raise ParseError(too_deep_detail()) from None
        strings = _SUSPECT_ESCAPE.search(body) is not None
        numbers = _SUSPECT_NUMBER.search(body) is not None
        # A body nested no deeper than the limit needs no walk for depth: a
        # metric batch of 500 flat points has 500 brackets but depth 3.
        if strings or numbers or _depth(body) > MAX_JSON_DEPTH:
            check_json(data, strings=strings)
        return data


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def _depth(body: bytes) -> int:
    """How deep a JSON body (already parsed, so well formed) nests: its
    brackets outside strings, as a running sum over only them."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # fewer brackets than the limit cannot nest past it
    brackets = np.frombuffer(_JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS),
                             dtype=np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _label(key) -> str:
    return key if isinstance(key, str) and not _UNSTORABLE.search(key) else ascii(key)


def _children(value, path: str):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item, f"{path}.{_label(key)}" if path else _label(key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield None, item, f"{path}[{i}]"


def _scalar_problem(value, strings: bool) -> str | None:
    if isinstance(value, str):
        return BAD_STRING if strings and _UNSTORABLE.search(value) else None
    if isinstance(value, float) and not math.isfinite(value):
        return BAD_NUMBER
    return None


def check_json(data, *, strings: bool = True) -> None:
    """Refuse a parsed body nested past MAX_JSON_DEPTH or holding a string
    or number PostgreSQL cannot store; iterative, so a deep body cannot
    exhaust the stack. The 400 names every bad place (a dotted path, `[i]`
    for list items)."""
    bad: dict[str, list[str]] = {}
    stack = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if not isinstance(value, dict | list):
            problem = _scalar_problem(value, strings)
            if problem:
                bad[path or "non_field_errors"] = [problem]
            continue
        if depth > MAX_JSON_DEPTH:
            raise ParseError(too_deep_detail())
        for key, item, child in _children(value, path):
            if strings and isinstance(key, str) and _UNSTORABLE.search(key):
                bad[child] = [f"Key: {BAD_STRING}"]
            stack.append((item, child, depth + 1))
    if bad:
        raise serializers.ValidationError(dict(sorted(bad.items())))


class ApiBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if (
            request.path.startswith(API_PREFIX)
            and _content_length(request) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        ):
            return JsonResponse({"detail": too_large_detail()}, status=413)
        return self.get_response(request)


class FormBodyLimitMiddleware:
    """A form posted to a page (the sign-in forms take anonymous ones) is
    parsed here, before CSRF's check and the view read it, so a body past
    REGATTA_MAX_BODY_BYTES is a 413 and one with more fields than Django
    parses (DATA_UPLOAD_MAX_NUMBER_FIELDS) a 400, each logged as one
    warning line. Left to Django, each would be an ERROR with a traceback:
    a cheap way for anyone to fill the logs."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and not request.path.startswith(API_PREFIX):
            try:
                request.POST  # noqa: B018 - parsed now, where its limits are answered
            except (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent) as exc:
                too_big = isinstance(exc, RequestDataTooBig)
                log.warning("refused a form posted to %s from %s: %s", request.path,
                            request.META.get("REMOTE_ADDR", "?"), exc)
                response = HttpResponse(
                    f"{too_large_detail() if too_big else exc}\n", content_type="text/plain",
                    status=413 if too_big else 400)
                response._has_been_logged = True  # this one line is the whole record
                return response
        return self.get_response(request)


def _content_length(request) -> int:
    # As Django reads it: a missing or unreadable length means no body is read.
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0
