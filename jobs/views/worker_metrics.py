from datetime import UTC, datetime

from django.utils import timezone
from rest_framework import status
from rest_framework.response import Response

from ..models import MetricPoint
from . import worker_schema
from .worker_base import Fields, WorkerView

MAX_BATCH = 5000


class MetricsView(WorkerView):
    """A batch of metric points. Idempotent: a point is unique per (attempt,
    rank, name, step), so a retried batch stores nothing twice."""

    @worker_schema.metrics
    def post(self, request, attempt_id):
        body = self.body()
        f = Fields(body)
        f.str("batch_id", max_length=100)
        points = body.get("points")
        if not isinstance(points, list):
            f.errors["points"] = ["A list is required."]
            f.check()
        if len(points) > MAX_BATCH:
            return Response(
                {"detail": f"At most {MAX_BATCH} points per batch; got {len(points)}."},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        attempt = self.attempt
        now = timezone.now()
        rows = []
        for i, point in enumerate(points):
            if not isinstance(point, dict):
                f.errors[f"points[{i}]"] = ["A JSON object is required."]
                break
            p = Fields(point, prefix=f"points[{i}].")
            rank = p.int("rank", maximum=65535)
            name = p.str("name", required=True, max_length=64)
            step = p.int("step")
            value = p.number("value", required=True)
            when = p.number("time")
            if not name and f"points[{i}].name" not in p.errors:
                p.errors[f"points[{i}].name"] = ["Must not be blank."]
            if p.errors:
                f.errors.update(p.errors)
                break
            rows.append(MetricPoint(
                job_id=attempt.job_id, attempt_id=attempt.pk, rank=rank, name=name, step=step,
                value=value, time=datetime.fromtimestamp(when, UTC) if when is not None else now,
            ))
        f.check()
        MetricPoint.objects.bulk_create(rows, ignore_conflicts=True, batch_size=1000)
        return Response({"stored": len(rows)})
