"""Inserting thousands of plain rows at once (a new 10,000-node pool and its
events) without building a model object per row.

`bulk_create` spends most of its time in the ORM: a model instance per row,
then a prepared value and a quoted literal per column (about 7 s for 30,000
rows on this project's 2-core box, against well under a second that
PostgreSQL needs to store them). On PostgreSQL the rows go through COPY into
a temporary table and from there into the table with one INSERT, which can
skip rows that break a unique constraint; other databases (SQLite) take the
ORM's path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.db import connection, transaction
from django.db.models import JSONField


def insert_rows(model, rows: Iterable[dict], *, ignore_conflicts: bool = False,
                batch_size: int = 1000) -> None:
    """Insert one row per dict of field values (every dict names the same
    fields; a field left out gets its default, a foreign key is given as
    `<name>_id`). With `ignore_conflicts`, rows that would break a unique
    constraint are skipped, as `bulk_create(ignore_conflicts=True)` does."""
    rows = list(rows)
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**row) for row in rows],
                                  ignore_conflicts=ignore_conflicts, batch_size=batch_size)
        return
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    plan = [_column_plan(f, rows[0]) for f in fields]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    conflict = " ON CONFLICT DO NOTHING" if ignore_conflicts else ""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMPORARY TABLE regatta_bulk ON COMMIT DROP AS "
                       f"SELECT {columns} FROM {table} WITH NO DATA")
        with cursor.cursor.copy(f"COPY regatta_bulk ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([default if key is None else convert(row[key])
                                for key, default, convert in plan])
        cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM regatta_bulk"
                       f"{conflict}")
        cursor.execute("DROP TABLE regatta_bulk")


def _column_plan(field, sample: dict):
    """(the row's key for the column or None, the default, a conversion),
    worked out once per insert rather than once per value."""
    key = field.attname if field.attname in sample else (
        field.name if field.name in sample and not field.is_relation else None)
    if isinstance(field, JSONField):
        def convert(value, encoder=field.encoder):
            return None if value is None else json.dumps(value, cls=encoder)
    else:
        def convert(value):
            return value
    return key, None if key is not None else convert(field.get_default()), convert


def update_by_ids(model, ids: Iterable[int], **values) -> int:
    """Set the same `values` on every row of `ids`: one UPDATE per as many
    ids as the database takes in one statement (SQLite: 999 parameters), so
    a change across a whole fleet is a statement or a few, not one a row."""
    ids = list(ids)
    limit = connection.features.max_query_params  # None: no limit (PostgreSQL)
    size = max(1, limit - len(values)) if limit else max(1, len(ids))
    changed = 0
    for start in range(0, len(ids), size):
        changed += model.objects.filter(pk__in=ids[start:start + size]).update(**values)
    return changed
