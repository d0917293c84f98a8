from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.response import Response

from controlplane.lib import telemetry

from ..models import MetricPoint
from . import worker_schema
from .worker_base import Fields, WorkerView

MAX_BATCH = 5000
# The last second a datetime can hold (9999-12-31T23:59:59Z).
MAX_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
# Copies of one batch racing each other: each lost race means the winner's
# rows are committed and seen on the next look, so a few looks settle it.
MAX_LOOKS = 5
POINT_FIELDS = ("rank", "name", "step", "value", "time")
# A reply names the errors of this many bad points at most.
MAX_BAD_POINTS = 20


class MetricsView(WorkerView):
    """A batch of metric points. Idempotent: a point is unique per (attempt,
    rank, name, step), so a retried batch stores nothing twice, and the reply
    says how many points were new and how many were already stored."""

    @worker_schema.metrics
    def post(self, request, attempt_id):
        f = self.fields(("batch_id", "points"))
        f.str("batch_id", max_length=100)
        points = f.data.get("points")
        if not isinstance(points, list):
            f.errors["points"] = ["A list is required."]
            f.check()
        if len(points) > MAX_BATCH:
            return Response(
                {"detail": f"At most {MAX_BATCH} points per batch; got {len(points)}."},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        rows = _rows(self.attempt, points, f)
        f.check()
        stored = _store_new(self.attempt, rows)
        telemetry.count("metric_points_ingested", stored)
        return Response({"stored": stored, "duplicates": len(rows) - stored})


def _rows(attempt, points: list, f: Fields) -> list:
    """The batch's points as rows; the errors of every bad point (up to
    MAX_BAD_POINTS of them) go into `f`."""
    now = timezone.now()
    rows, bad = [], 0
    for i, point in enumerate(points):
        if bad >= MAX_BAD_POINTS:
            break
        row = _row(attempt, point, f"points[{i}]", f, now)
        if row is None:
            bad += 1
        else:
            rows.append(row)
    return rows


def _row(attempt, point, where: str, f: Fields, now):
    if not isinstance(point, dict):
        f.errors[where] = ["A JSON object is required."]
        return None
    p = Fields(point, prefix=f"{where}.", known=POINT_FIELDS)
    rank = p.int("rank", maximum=65535)
    name = p.str("name", required=True, max_length=64)
    step = p.int("step")
    value = p.number("value", required=True)
    when = p.number("time", minimum=0)
    if when is not None and when > MAX_TIME:
        p.errors[f"{where}.time"] = [
            f"Must be a Unix time in seconds between 0 and {MAX_TIME:.0f}."
        ]
    if not name and f"{where}.name" not in p.errors:
        p.errors[f"{where}.name"] = ["Must not be blank."]
    if p.errors:
        f.errors.update(p.errors)
        return None
    return MetricPoint(
        job_id=attempt.job_id, attempt_id=attempt.pk, rank=rank, name=name, step=step,
        value=value, time=datetime.fromtimestamp(when, UTC) if when is not None else now,
    )


def _not_stored(attempt, rows) -> list:
    stored = set(
        MetricPoint.objects.filter(
            attempt=attempt, step__in={row.step for row in rows},
            name__in={row.name for row in rows},
        ).values_list("rank", "name", "step")
    )
    new = {}
    for row in rows:
        key = (row.rank, row.name, row.step)
        if key not in stored:
            new.setdefault(key, row)  # the first of a point repeated in the batch wins
    return list(new.values())


def _store_new(attempt, rows) -> int:
    """Insert the points not stored yet and return how many that was. A plain
    insert, not ignore_conflicts, so that losing a race to another copy of the
    batch shows up as an IntegrityError and the count stays exact."""
    for _ in range(MAX_LOOKS):
        new = _not_stored(attempt, rows)
        try:
            with transaction.atomic():
                MetricPoint.objects.bulk_create(new, batch_size=1000)
        except IntegrityError:
            continue
        return len(new)
    # Still racing after several looks: store what is left, never a point twice.
    new = _not_stored(attempt, rows)
    MetricPoint.objects.bulk_create(new, ignore_conflicts=True, batch_size=1000)
    return len(new)
