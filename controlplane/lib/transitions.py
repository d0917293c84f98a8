"""One conditional state change for every model with a state machine.

A model names its state field (`STATE_FIELD`), what it is called in errors
(`STATE_KIND`; an optional `state_label` names the object, else its pk) and a table of legal moves
(`TRANSITIONS`: target -> the states it may be reached from). `change_state`
makes a move with a conditional UPDATE (`... WHERE state = <source>`), so two
passes racing each other can never both make it, and raises
`IllegalTransition` (the API's 409) for a move the table does not allow. The
model's own method around it writes the event that records why (JobEvent,
NodeEvent): the event shape is the model's, the rule is here.
"""

from __future__ import annotations

import json

from django.db import transaction
from django.utils import timezone

from .errors import IllegalTransition

# `expected` default: the move is conditional on the state the caller holds in
# memory, i.e. on what it read and decided from.
HELD = object()


def change_state(obj, target, *, expected=HELD, noop_from=(), changed_at_field=None,
                 now=None, **fields):
    """Move `obj` to `target`; returns the state it left, or None for a no-op.

    expected: the state the row must be in (default: the one `obj` holds);
      None accepts any state the table allows (the row is read, locked).
    noop_from: states in which the move is quietly skipped (None returned),
      e.g. an attempt that already ended is not ended again.
    changed_at_field: a timestamp field set to `now` with the move.
    fields: further columns written in the same UPDATE.
    """
    model = type(obj)
    name = model.STATE_FIELD
    allowed = model.TRANSITIONS[target]
    with transaction.atomic():
        rows = model.objects.filter(pk=obj.pk)
        current = rows.select_for_update().values_list(name, flat=True).first()
        if current in noop_from:
            obj.refresh_from_db()
            return None
        source = getattr(obj, name) if expected is HELD else (expected or current)
        if changed_at_field is not None:
            fields[changed_at_field] = now
        changed = 0
        if source in allowed and current == source:
            changed = rows.filter(**{name: source}).update(**{name: target}, **fields)
        if not changed:
            raise IllegalTransition(model.STATE_KIND, getattr(obj, "state_label", obj.pk),
                                    current, target)
        obj.refresh_from_db()
        return source


def event_time(now=None):
    """When an event happened: the pass's clock, but never before the moment
    it is written. A pass reads its clock once as it begins; an event it
    writes later must not sort before a worker's report that came in
    meanwhile (a resume before the emergency checkpoint it resumes from).
    Tests that run passes at a simulated later time keep their times."""
    wall = timezone.now()
    return wall if now is None else max(now, wall)


def change_states(objs, target, *, source, fields=()) -> None:
    """Move many rows, each locked by the caller's transaction and read in
    `source`, to `target`, with the columns in `fields` that the caller set
    on each object: one conditional UPDATE per batch (`... WHERE state =
    <source>`) instead of a locked read, an update and a re-read per row.
    Raises IllegalTransition if the table forbids the move or a row was not
    in `source` (the caller's transaction then writes nothing)."""
    if not objs:
        return
    model = type(objs[0])
    name = model.STATE_FIELD
    if source not in model.TRANSITIONS[target]:
        raise IllegalTransition(model.STATE_KIND, f"{len(objs)} rows", source, target)
    moved = 0
    # Rows that get the same values move together: one plain UPDATE per
    # group and batch. (`bulk_update` builds a CASE per row and column, which
    # costs more to compile than the database spends running it.) An
    # admission pass's jobs mostly share their values: the pass's clock, the
    # pool, no borrowing.
    for group in _by_values(objs, fields).values():
        changes = {name: target, **dict(zip(fields, group[0][1], strict=True))}
        for start in range(0, len(group), 500):
            pks = [obj.pk for obj, _ in group[start:start + 500]]
            moved += model.objects.filter(pk__in=pks, **{name: source}).update(**changes)
    for obj in objs:
        setattr(obj, name, target)
    if moved != len(objs):
        raise IllegalTransition(model.STATE_KIND, f"{len(objs) - moved} of {len(objs)} rows",
                                "another state", target)


def _by_values(objs, fields) -> dict[str, list]:
    """(obj, its values of `fields`) grouped by those values. JSON columns
    hold dicts and lists, so the key is their JSON text."""
    groups: dict[str, list] = {}
    for obj in objs:
        values = tuple(getattr(obj, f) for f in fields)
        key = json.dumps([_comparable(v) for v in values], sort_keys=True, default=str)
        groups.setdefault(key, []).append((obj, values))
    return groups


def _comparable(value):
    # A foreign key's object is compared (and written) by its id.
    return getattr(value, "pk", value)
