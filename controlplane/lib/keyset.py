"""Keyset (cursor) pages for lists that grow with the data.

An offset page makes the database walk past every row before it, and a
`count` makes it walk them all, on every page; a keyset page starts from
the last row it showed (`WHERE (created_at, id) < (…)` on an index), so
page 2,000 costs what page 1 does.

The list's own `order_by` is the key: the view orders by fields whose last
one is unique within the list and never null (`-created_at, -id`;
`-step` within one job). A page carries `next` (and `previous` once past
the first) as links with an opaque `cursor`; `count` only when the caller
asks with `?count=true`. `?offset=` still works (bounded, see
pagination.py) for clients that page that way, and its `next` link is a
cursor, so a client that follows links leaves the slow path after one page.
See docs/api.md, "Pagination".
"""

import base64
import binascii
import json
import re
from datetime import datetime

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from .pagination import BoundedLimitOffsetPagination

BIGINT = 2**63  # what PostgreSQL can compare an integer key with
_ASKED = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": False}


# What _encode writes: URL-safe base64 of `{"k":[…],"b":…}`, unpadded, so
# it always starts with the encoding of `{"k":[`. A cursor of another shape
# is bad input (400); one of this shape that names no key of the list names
# no page (404), as a made-up page number would.
CURSOR = re.compile(r"^eyJrIjpb[A-Za-z0-9_-]+$")


def _invalid(param: str):
    return serializers.ValidationError({param: ["Not a cursor from this list: follow the "
                                                "`next` or `previous` link as it came."]})


def _no_page(param: str):
    return NotFound(f"No page of this list starts at that {param}: follow the `next` or "
                    "`previous` link as it came.")


def _ordering(queryset) -> list[tuple[str, bool]]:
    """[(field, descending)] from the list's order_by (the model's default
    ordering when the view set none)."""
    fields = queryset.query.order_by or queryset.model._meta.ordering
    return [(f.lstrip("-"), f.startswith("-")) for f in fields]


def _encode(values: list, backwards: bool) -> str:
    raw = json.dumps({"k": values, "b": int(backwards)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _plain(value):
    return value.isoformat() if isinstance(value, datetime) else value


def _checked(model, name: str, value):
    """The cursor's value as the column's Python type, or None when it is
    not one (a cursor edited by hand must be a 400, never a database error)."""
    field = model._meta.get_field("id" if name == "pk" else name)
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return None
    if isinstance(value, int) and not -BIGINT <= value < BIGINT:
        return None
    try:
        typed = field.to_python(value)
    except (DjangoValidationError, ValueError, TypeError, OverflowError):
        return None
    if isinstance(typed, int) and not -BIGINT <= typed < BIGINT:
        return None
    return typed


def after(ordering: list[tuple[str, bool]], values: list, backwards: bool) -> Q:
    """Rows strictly past `values` in the list's order (before them when
    `backwards`). The first key's bound is repeated outside the OR so the
    database can start its index scan there instead of at the top."""
    def op(desc: bool) -> str:
        return "lt" if desc != backwards else "gt"

    first, first_desc = ordering[0]
    bound = Q(**{f"{first}__{op(first_desc)}e": values[0]})
    past = Q()
    for i, (name, desc) in enumerate(ordering):
        equal = {ordering[j][0]: values[j] for j in range(i)}
        past |= Q(**equal, **{f"{name}__{op(desc)}": values[i]})
    return bound & past


class KeysetPagination(BoundedLimitOffsetPagination):
    cursor_query_param = "cursor"
    count_query_param = "count"

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.limit = self.get_limit(request)
        self.ordering = _ordering(queryset)
        self.count = self._count(queryset, request)
        self.offset = None
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None and self.offset_query_param in request.query_params:
            return self._offset_page(queryset, request)
        # An empty cursor is no cursor of this list either: a 400, as the schema says.
        values, self.backwards = (self._decode(raw, queryset.model) if raw is not None
                                  else ([], False))
        if values:
            queryset = queryset.filter(after(self.ordering, values, self.backwards))
        if self.backwards:
            queryset = queryset.reverse()
        rows = list(queryset[: self.limit + 1])
        more = len(rows) > self.limit
        rows = rows[: self.limit]
        if self.backwards:
            rows.reverse()
        # Going forward there is a previous page once we started past the
        # top; going back there is a next page (the one we came from).
        self.has_next = more if not self.backwards else True
        self.has_previous = bool(values) if not self.backwards else more
        self.page = rows
        return rows

    def _offset_page(self, queryset, request):
        self.offset = self.get_offset(request)
        rows = list(queryset[self.offset: self.offset + self.limit + 1])
        self.has_next = len(rows) > self.limit
        self.has_previous = self.offset > 0
        self.page = rows[: self.limit]
        return self.page

    def _count(self, queryset, request):
        asked = _ASKED.get(request.query_params.get(self.count_query_param, "").strip().lower())
        if asked is None:
            raise serializers.ValidationError(
                {self.count_query_param: ["`true` or `false` is required."]})
        return queryset.count() if asked else None

    def _decode(self, raw: str, model) -> tuple[list, bool]:
        if not CURSOR.fullmatch(raw):
            raise _invalid(self.cursor_query_param)
        try:
            padded = raw + "=" * (-len(raw) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
            values, backwards = data["k"], bool(data["b"])
        except (ValueError, TypeError, KeyError, binascii.Error, UnicodeError):
            raise _no_page(self.cursor_query_param) from None
        if not isinstance(values, list) or len(values) != len(self.ordering):
            raise _no_page(self.cursor_query_param)
        names = [name for name, _ in self.ordering]
        typed = [_checked(model, name, v) for name, v in zip(names, values, strict=True)]
        if any(v is None for v in typed):
            raise _no_page(self.cursor_query_param)
        return typed, backwards

    def _key(self, row) -> list:
        return [_plain(getattr(row, "pk" if name == "pk" else name)) for name, _ in self.ordering]

    def _link(self, row, backwards: bool) -> str:
        url = self.request.build_absolute_uri()
        url = remove_query_param(url, self.offset_query_param)
        url = replace_query_param(url, self.limit_query_param, self.limit)
        return replace_query_param(url, self.cursor_query_param,
                                   _encode(self._key(row), backwards))

    def get_next_link(self):
        if not (self.has_next and self.page):
            return None
        return self._link(self.page[-1], backwards=False)

    def get_previous_link(self):
        if not self.has_previous:
            return None
        if self.offset is not None:  # an offset page's way back is the offset before it
            return super().get_previous_link()
        if not self.page:
            return None
        return self._link(self.page[0], backwards=True)

    def get_paginated_response(self, data):
        body = {"next": self.get_next_link(), "previous": self.get_previous_link(),
                "results": data}
        if self.count is not None:
            body = {"count": self.count, **body}
        return Response(body)

    def get_paginated_response_schema(self, schema):
        reply = super().get_paginated_response_schema(schema)
        reply["required"] = ["results"]
        reply["properties"]["count"]["description"] = "Only with `?count=true`."
        return reply

    def get_schema_operation_parameters(self, view):
        return [*super().get_schema_operation_parameters(view), {
            "name": self.cursor_query_param, "required": False, "in": "query",
            "description": "Where the page starts: from a `next` or `previous` link.",
            "schema": {"type": "string", "pattern": CURSOR.pattern},
        }, {
            "name": self.count_query_param, "required": False, "in": "query",
            "description": "`true` adds the list's `count` (a full count: slow on big lists).",
            "schema": {"type": "boolean"},
        }]
