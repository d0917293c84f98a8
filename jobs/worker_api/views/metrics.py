from regatta import contract
from rest_framework import exceptions, status
from rest_framework.response import Response

from controlplane.lib import telemetry
from jobs.metrics import ingest
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import Fields, WorkerView

MAX_BATCH = contract.METRIC_BATCH["points"].max_length
# A reply names the errors of this many bad points at most.
MAX_BAD_POINTS = 20


class MetricsView(WorkerView):
    """A batch of metric points. Idempotent: a point is unique per (attempt,
    rank, name, step), so a retried batch stores nothing twice, and the reply
    says how many points were new and how many were already stored. The
    write is one statement (jobs/metrics/ingest.py); the token was checked without a
    read (jobs/worker_api/auth.py)."""

    @worker_schema.metrics
    def post(self, request, attempt_id):
        f = self.fields(contract.METRIC_BATCH)
        points = f.read(contract.METRIC_BATCH)["points"]
        if "points" in f.errors:
            f.check()
        if len(points) > MAX_BATCH:
            return Response(
                {"detail": f"At most {MAX_BATCH} points per batch; got {len(points)}."},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        if not all(map(ingest.point_ok, points)):
            _name_errors(points, f)
            f.errors = f.errors or {"points": ["A point is malformed."]}
        f.check()
        claim = self.claim
        try:
            stored = ingest.store(claim.job_id, claim.attempt_id, ingest.rows(points),
                                  received=len(points))
        except ingest.AttemptGone:
            raise exceptions.AuthenticationFailed("Invalid worker token.") from None
        telemetry.count_soon("metric_points_ingested", stored.new)
        return Response({"stored": stored.new, "duplicates": stored.duplicates})


def _name_errors(points: list, f: Fields) -> None:
    """The errors of every bad point (up to MAX_BAD_POINTS of them) into `f`:
    the slow path, taken only once the fast check found a bad one."""
    bad = 0
    for i, point in enumerate(points):
        if bad >= MAX_BAD_POINTS:
            break
        bad += not _check_point(point, f"points[{i}]", f)


def _check_point(point, where: str, f: Fields) -> bool:
    if not isinstance(point, dict):
        f.errors[where] = ["A JSON object is required."]
        return False
    p = Fields(point, prefix=f"{where}.", known=tuple(contract.METRIC_POINT.names))
    p.read(contract.METRIC_POINT)
    f.errors.update(p.errors)
    return not p.errors

