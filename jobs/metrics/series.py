"""Metric series for charts: one value per step, downsampled with LTTB.

Largest-Triangle-Three-Buckets (Steinarsson, 2013) keeps the points that
carry a chart's shape, so a loss spike survives downsampling where a plain
stride or bucket mean would smooth it away.
"""

from dataclasses import dataclass

import numpy as np
from django.db.models import Count, ExpressionWrapper, F, IntegerField, Max, Min, Q

from jobs.metrics import laid_in, rollup_reads
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt

DEFAULT_POINTS = 600
MAX_POINTS = 5000
_CHUNK = 20_000
# Past this many points the database buckets the series before LTTB runs.
EXACT_LIMIT = 20_000


def lttb(steps, values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Downsample (steps, values), sorted by step, to at most `n` points.
    The first and last points are always kept."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    size = len(x)
    if n >= size or size <= 2:
        return x, y
    if n < 3:
        keep = np.array([0, size - 1][:max(n, 1)])
        return x[keep], y[keep]
    # Bucket edges over the points strictly between the first and the last.
    edges = np.linspace(1, size - 1, n - 1).astype(np.int64)
    chosen = np.empty(n, dtype=np.int64)
    chosen[0], chosen[-1] = 0, size - 1
    # Each bucket's point is chosen against the mean of the next bucket
    # (the last point, for the last bucket): all of them at once, not one
    # ndarray.mean() an iteration (a third of a 600-point chart's time).
    counts = np.diff(edges)
    next_x = np.append((np.add.reduceat(x[:size - 1], edges[:-1]) / counts)[1:], x[-1])
    next_y = np.append((np.add.reduceat(y[:size - 1], edges[:-1]) / counts)[1:], y[-1])
    a = 0
    for i in range(n - 2):
        lo, hi = edges[i], edges[i + 1]
        cx, cy = next_x[i], next_y[i]
        ax, ay = x[a], y[a]
        area = np.abs((ax - cx) * (y[lo:hi] - ay) - (ax - x[lo:hi]) * (cy - ay))
        a = lo + int(area.argmax())
        chosen[i + 1] = a
    return x[chosen], y[chosen]


def _attempts(job_id: int) -> list[tuple[int, int | None]]:
    """The job's attempts as (id, resume step), newest first."""
    return list(JobAttempt.objects.filter(job_id=job_id).order_by("-number").values_list(
        "id", "resume_step"))


def _speakers(job_id: int, name: str):
    """The metric's points that speak for the job: rank 0's when rank 0
    reported it, else every rank's; and whether that is rank 0's. The probe
    is a lookup on the primary key's prefix (job, name, rank), never a scan
    however many rows the planner expects."""
    points = MetricPoint.objects.filter(job_id=job_id, name=name)
    if points.filter(rank=0).exists():
        return points.filter(rank=0), True
    return points, False


def _cutoffs(attempts: list[tuple[int, int | None]], points) -> dict[int | None, list[int]]:
    """Attempt ids grouped by the last step of theirs the chart shows (None:
    all of them).

    Where a rollback replays steps, the newest attempt wins: an attempt's
    points count only up to the step its successors resumed from. That step
    is the attempt's recorded resume step, so the boundaries cost no query
    however many restarts the job had; only an attempt that recorded none
    (its first point says where it began) costs an index lookup of its own.
    Attempts cut off at the same step share one group."""
    by_bound: dict[int | None, list[int]] = {}
    boundary = None
    for index, (attempt_id, resume_step) in enumerate(attempts):
        by_bound.setdefault(boundary, []).append(attempt_id)
        if index == len(attempts) - 1:
            break  # nothing older for the oldest attempt to cut off
        if resume_step is None:
            first = points.filter(attempt_id=attempt_id).order_by("step").values_list(
                "step", flat=True
            ).first()
            if first is None:
                continue  # reported nothing: it replaced nothing
            resume_step = first - 1
        boundary = resume_step if boundary is None else min(boundary, resume_step)
    return by_bound


@dataclass
class Plan:
    """What a chart of one metric reads: the speaking points (a queryset),
    whether they are rank 0's, and the attempts grouped by cut-off step."""

    points: object
    rank0: bool
    cuts: dict[int | None, list[int]]


def plan(job_id: int, name: str) -> Plan | None:
    attempts = _attempts(job_id)
    if not attempts:
        return None
    points, rank0 = _speakers(job_id, name)
    return Plan(points, rank0, _cutoffs(attempts, points))


def effective_points_of(chart: Plan):
    """The points of one metric that the chart shows, as a queryset: rank 0
    speaks for the job when it reported the metric, and the newest attempt
    wins the steps a rollback replayed (`_cutoffs`)."""
    # The clauses are joined once (repeated `|=` copies the whole tree each time).
    clauses = [
        Q(attempt_id__in=ids) if bound is None else Q(attempt_id__in=ids, step__lte=bound)
        for bound, ids in chart.cuts.items()
    ]
    return chart.points.filter(Q(*clauses, _connector=Q.OR))


def _dedupe(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(steps):
        return steps, values
    first = np.empty(len(steps), dtype=bool)
    first[0] = True
    np.not_equal(steps[1:], steps[:-1], out=first[1:])
    return steps[first], values[first]


def read_series(chosen) -> tuple[np.ndarray, np.ndarray]:
    """Every (step, value) of a metric's effective points, one value per step."""
    rows = chosen.order_by("step").values_list("step", "value")
    flat = np.fromiter((v for row in rows.iterator(chunk_size=_CHUNK) for v in row),
                       dtype=np.float64)
    table = flat.reshape(-1, 2)
    return _dedupe(table[:, 0], table[:, 1])


def _extremes(table: np.ndarray):
    """Steps and values of bucket rows (s0, s1, vmin, vmax, n) sorted by
    step: each bucket's lowest and highest value at its middle step, so
    spikes survive for LTTB to choose from. Returns the steps, values and the
    number of points the buckets hold."""
    steps = np.repeat((table[:, 0] + table[:, 1]) / 2, 2)
    low, high = table[:, 2], table[:, 3]
    # Put each bucket's extremes in the order the curve runs: on a falling
    # stretch the high comes first.
    middle = (low + high) / 2
    falling = np.append(middle[1:] < middle[:-1], middle[-1] < middle[-2] if len(middle) > 1
                        else False)
    values = np.where(falling[:, None], np.c_[high, low], np.c_[low, high]).reshape(-1)
    return steps, values, int(table[:, 4].sum())


def _bucketed(points, lo: int, hi: int, buckets: int):
    """The database cuts a long series down in one pass over its raw points:
    only for points that have no rollups (written around jobs.metrics.ingest, e.g.
    by hand or by a test); ingested points are read from their rollups."""
    width = max(1, -(-(hi - lo + 1) // buckets))
    rows = (
        points.annotate(bucket=ExpressionWrapper(F("step") / width, output_field=IntegerField()))
        .values("bucket")
        .annotate(s0=Min("step"), s1=Max("step"), v0=Min("value"), v1=Max("value"),
                  n=Count("step"))
        .order_by("bucket")
        .values_list("s0", "s1", "v0", "v1", "n")
    )
    return _extremes(np.array(list(rows), dtype=np.float64).reshape(-1, 5))


def _raw_series(chart: Plan, points: int):
    """The series from raw points: exact (LTTB over every step) while short."""
    chosen = effective_points_of(chart)
    # Index lookups, not scans: the ends of the series and whether it is long.
    ordered = chosen.order_by("step").values_list("step", flat=True)
    lo, hi = ordered.first(), chosen.order_by("-step").values_list("step", flat=True).first()
    long_series = lo is not None and ordered[max(EXACT_LIMIT, 4 * points):][:1].exists()
    if long_series:
        return _bucketed(chosen, lo, hi, 4 * points)
    steps, values = read_series(chosen)
    return steps, values, len(steps)


def with_eval_points(steps, values, extra: list[tuple[int, float]]):
    """The job's own series with its eval runs' points (one a checkpoint
    step, jobs/evals/) laid in; at a step both have, the eval run's wins:
    it read the very checkpoint of that step."""
    taken = np.array([s for s, _ in extra], dtype=np.float64)
    keep = ~np.isin(np.asarray(steps, dtype=np.float64), taken)
    all_steps = np.concatenate([np.asarray(steps, dtype=np.float64)[keep], taken])
    all_values = np.concatenate([np.asarray(values, dtype=np.float64)[keep],
                                 np.array([v for _, v in extra], dtype=np.float64)])
    order = np.argsort(all_steps, kind="stable")
    return all_steps[order], all_values[order]


def series(job_id: int, name: str, points: int = DEFAULT_POINTS) -> dict:
    chart = plan(job_id, name)
    if chart is None:
        steps = values = np.empty(0)
        total = 0
    else:
        ids = [i for group in chart.cuts.values() for i in group]
        rolled = rollup_reads.summary(name, chart.rank0, ids)
        if rolled.points > max(EXACT_LIMIT, 4 * points):
            # Two points (low and high) a bucket: 2×points buckets give LTTB
            # 4×points to choose from, as the raw path's buckets do.
            steps, values, total = _extremes(rollup_reads.buckets(
                name, chart.rank0, chart.cuts, chart.points, rolled, 2 * points))
        else:
            steps, values, total = _raw_series(chart, points)
    extra = laid_in.EVAL_RESULTS.points(job_id, name)
    if extra:
        steps, values = with_eval_points(steps, values, extra)
        total += len(extra)
    xs, ys = lttb(steps, values, points)
    return {
        "name": name,
        "total": int(total),
        "points": [[int(s), float(v)] for s, v in zip(xs.tolist(), ys.tolist(), strict=True)],
    }
