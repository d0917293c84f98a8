"""Reading a long series from its rollups (kept on ingest, jobs/metrics/rollups.py).

A chart of N points reads the level whose bucket count is just above 2×N
(a low and a high a bucket: 4×N points for LTTB to choose from), per
attempt, with the attempts' cut-offs (the newest attempt wins steps a
rollback replayed, jobs/metrics/series.py) applied to whole buckets. A bucket that a
cut-off splits (its first steps kept, its last ones replayed by a newer
attempt) is not taken from the rollup, which cannot be split: it is
recomputed from the raw points on its kept side, at most one bucket of at
most `level` points per attempt, found by the unique key's index. So
cut-offs stay exact to the step, and the cost of a chart follows its width
and the number of attempts, never the series' length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.db.models import Count, Max, Min, Q, Sum

from jobs.metrics.models import MetricRollup
from jobs.metrics.rollups import LEVELS


@dataclass
class Summary:
    """The speaking points' count and step range, from the coarsest level
    (a few rows per attempt): enough to tell a long series and to pick the
    level. Counts every attempt's points, cut off or not."""

    points: int
    lo: int
    hi: int


def summary(name: str, rank0: bool, attempt_ids: list[int]) -> Summary:
    row = MetricRollup.objects.filter(
        attempt_id__in=attempt_ids, name=name, rank0=rank0, level=LEVELS[-1]
    ).aggregate(n=Sum("n"), lo=Min("s0"), hi=Max("s1"))
    return Summary(points=row["n"] or 0, lo=row["lo"] or 0, hi=row["hi"] or 0)


def level_for(span: int, buckets: int) -> int:
    """The coarsest level that still cuts `span` steps into `buckets` or more."""
    for level in reversed(LEVELS):
        if span // level >= buckets:
            return level
    return LEVELS[0]


def buckets(name: str, rank0: bool, cuts: dict[int | None, list[int]], points,
            total: Summary, wanted: int) -> np.ndarray:
    """Bucket rows (s0, s1, vmin, vmax, n) of the effective series, sorted by
    step. `points` are the speaking raw points (for split buckets)."""
    level = level_for(total.hi - total.lo + 1, wanted)
    whole, split = [], []
    for bound, ids in cuts.items():
        if bound is None:
            whole.append(Q(attempt_id__in=ids))
            continue
        # Buckets below `kept` end at or before the cut-off step.
        kept = (bound + 1) // level
        whole.append(Q(attempt_id__in=ids, bucket__lt=kept))
        if (bound + 1) % level:
            split.append(Q(attempt_id__in=ids, step__gte=kept * level, step__lte=bound))
    rows = list(
        MetricRollup.objects.filter(name=name, rank0=rank0, level=level)
        .filter(Q(*whole, _connector=Q.OR))
        .values_list("s0", "s1", "vmin", "vmax", "n")
    )
    if split:
        rows += list(
            points.filter(Q(*split, _connector=Q.OR)).values("attempt_id")
            .annotate(s0=Min("step"), s1=Max("step"), v0=Min("value"), v1=Max("value"),
                      n=Count("step"))
            .order_by().values_list("s0", "s1", "v0", "v1", "n")
        )
    table = np.array(rows, dtype=np.float64).reshape(-1, 5)
    return table[np.argsort(table[:, 0], kind="stable")]
