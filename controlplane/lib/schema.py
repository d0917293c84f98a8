"""The OpenAPI schema says what the server does (drf-spectacular's
AutoSchema, as DEFAULT_SCHEMA_CLASS):

- every operation documents its error replies (400, 401, 403; 404 where the
  path names an object) with the one shape they all share;
- a request body of a strict validator (StrictSerializer) allows no other
  properties, as the server refuses unknown fields.
"""

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent

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


class RegattaAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        self.registry.register_on_missing(ERROR)
        for code, description in ERRORS.items():
            if code == "404" and "{" not in self.path:
                continue
            reply = responses.setdefault(code, {"description": description})
            if not reply.get("content"):
                reply["description"] = reply.get("description") or description
                reply["content"] = {"application/json": {"schema": ERROR.ref}}
        return responses

    def _map_serializer(self, serializer, direction, bypass_extensions=False):
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False
        return schema
