"""Every list endpoint pages with `?limit=&offset=`, bounded.

`limit` is a whole number from 1; past MAX_LIMIT it is capped (the reply's
`next` link carries the capped value). `offset` is a whole number from 0 to
MAX_OFFSET. Anything else (`limit=abc`, `limit=0`, `offset=-1`, a number
with hundreds of digits) is a 400 naming the parameter, never a database
error. See docs/api.md, "Limits".
"""

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500
# Far past any list a team or the fleet has, and inside PostgreSQL's bigint.
MAX_OFFSET = 1_000_000_000
_DIGITS = 19  # no bound above has more


def _whole(raw: str) -> int | None:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _DIGITS:
        return None
    return int(raw)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        value = _whole(raw.strip())
        if value is None and raw.strip().isascii() and raw.strip().isdigit():
            return self.max_limit  # a whole number too long to read: capped like any other
        if value is None or value < 1:
            raise serializers.ValidationError(
                {self.limit_query_param: [f"A whole number from 1 is required "
                                          f"(at most {self.max_limit} are returned)."]}
            )
        return min(value, self.max_limit)

    def get_offset(self, request):
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        value = _whole(raw.strip())
        if value is None or value > MAX_OFFSET:
            raise serializers.ValidationError(
                {self.offset_query_param: [f"A whole number from 0 to {MAX_OFFSET} is required."]}
            )
        return value

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: {"minimum": 1},
                  self.offset_query_param: {"minimum": 0, "maximum": MAX_OFFSET}}
        for param in params:
            param["schema"].update(bounds.get(param["name"], {}))
        return params
