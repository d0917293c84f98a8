"""The OpenAPI schema says what the server does (drf-spectacular's
AutoSchema, as DEFAULT_SCHEMA_CLASS), so a generated client knows each
constraint and each status before it meets them:

- every operation documents its error replies (400, 401, 403; 404 where the
  path names an object, or where a list's cursor may name no page) with the
  one shape they all share; an operation that takes a body documents 413
  (REGATTA_MAX_BODY_BYTES, ApiBodyLimitMiddleware) and 415 (JSON only);
- a request body of a strict validator (StrictSerializer) allows no other
  properties, as the server refuses unknown fields;
- a text field of a request, or a text query parameter, holds no NUL (the
  parsers refuse it anywhere: controlplane/lib/parsers.py, http.py), and
  one that may not be blank says so: at least one character, and one that
  is not whitespace (DRF trims it first).

tests/test_schemathesis.py holds the server to it with every response
check schemathesis has.
"""

from django.core.validators import RegexValidator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from .keyset import KeysetPagination
from .validation import StrictSerializer

ERROR = ResolvedComponent(
    name="Error", type=ResolvedComponent.SCHEMA, object="Error",
    schema={
        "type": "object",
        "description": "An error. `detail` says what is wrong; a 400 about the input maps each "
                       "bad field or query parameter to its messages instead "
                       "(`{\"num_nodes\": [\"…\"]}`), a dotted path for a nested one.",
        "properties": {"detail": {"type": "string"}},
        "additionalProperties": True,
    },
)
ERRORS = {
    "400": "Bad input: a body or query parameter the server refuses, each named.",
    "401": "No credentials, or a bad, revoked or wrong kind of token.",
    "403": "Authenticated but not allowed.",
    "404": "Not there, or not yours.",
}
BODY_ERRORS = {
    "413": "The body is larger than the server takes (REGATTA_MAX_BODY_BYTES).",
    "415": "The body is not JSON (Content-Type: application/json).",
}
NO_PAGE = "Not there, or not yours; or a `cursor` that names no page of this list."
NO_NUL = r"^[^\x00]*$"
# DRF trims a text field (str.strip) before it checks it is not blank, so one
# character must be none of what strip() removes: spelled out, since the
# regex engines a client may use disagree on what \s is (ECMA's leaves out
# \x1c-\x1f and \x85).
STRIPPED = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK_NO_NUL = rf"^[^\x00]*[^\x00{STRIPPED}][^\x00]*$"


class RegattaAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        self.registry.register_on_missing(ERROR)
        for code, description in self._error_replies().items():
            reply = responses.setdefault(code, {"description": description})
            if not reply.get("content"):
                reply["description"] = reply.get("description") or description
                reply["content"] = {"application/json": {"schema": ERROR.ref}}
        return responses

    def _error_replies(self) -> dict[str, str]:
        replies = dict(ERRORS)
        if self._pages_by_cursor():
            replies["404"] = NO_PAGE
        elif "{" not in self.path:
            del replies["404"]
        if self.method in ("POST", "PUT", "PATCH"):
            replies["413"] = BODY_ERRORS["413"]
            if self.get_request_serializer() is not None:
                replies["415"] = BODY_ERRORS["415"]
        return replies

    def _pages_by_cursor(self) -> bool:
        return self.method == "GET" and isinstance(self._get_paginator(), KeysetPagination)

    def _map_serializer(self, serializer, direction, bypass_extensions=False):
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (direction == "request" and isinstance(field, serializers.CharField)
                and not field.read_only and schema.get("type") == "string"):
            blank_refused = not field.allow_blank
            if blank_refused:
                schema.setdefault("minLength", 1)
            patterned = any(isinstance(v, RegexValidator) for v in field.validators)
            if not patterned and "format" not in schema:
                schema["pattern"] = (NOT_BLANK_NO_NUL if blank_refused and field.trim_whitespace
                                     else NO_NUL)
        return schema

    def _get_parameters(self):
        parameters = super()._get_parameters()
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if schema.get("type") == "string" and not {"pattern", "enum", "format"} & set(schema):
                schema["pattern"] = NO_NUL
        return parameters
