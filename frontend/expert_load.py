"""The job page's expert-load heatmap: for one MoE layer, each expert's share
of the routed tokens (`moe/layer<L>/expert<E>_load`, trainer/moe.py) by step.

Each expert's row is its downsampled series (jobs.metrics.series, LTTB over the
rollups), so the cost follows the chart's width, not the job's length. LTTB
keeps different steps for different series, so the rows are laid on one grid
of columns: every step any row kept while they are few, else equal spans of
steps, each cell the mean of the row's points in its span.
"""

import re

import numpy as np

from jobs.metrics import series
from jobs.metrics.models import MetricName
from jobs.models import TrainingJob

COLUMNS = 200
LOAD = re.compile(r"^moe/layer(\d+)/expert(\d+)_load$")


def layers(job: TrainingJob) -> dict[int, list[int]]:
    """Layer -> its experts, from the job's metric names (an index range scan)."""
    found: dict[int, list[int]] = {}
    names = MetricName.objects.filter(job=job, name__startswith="moe/layer").values_list(
        "name", flat=True)
    for name in names:
        match = LOAD.match(name)
        if match:
            found.setdefault(int(match[1]), []).append(int(match[2]))
    return {layer: sorted(experts) for layer, experts in sorted(found.items())}


def grid(rows: list[list[list[float]]], columns: int) -> tuple[list[float], list[list]]:
    """Rows of [step, value] points laid on one set of columns: (x, z), a
    cell None where its row has no point."""
    steps = sorted({p[0] for row in rows for p in row})
    if not steps:
        return [], [[] for _ in rows]
    if len(steps) <= columns:
        at = {s: i for i, s in enumerate(steps)}
        z = [[None] * len(steps) for _ in rows]
        for r, row in enumerate(rows):
            for s, v in row:
                z[r][at[s]] = v
        return steps, z
    edges = np.linspace(steps[0], steps[-1], columns + 1)
    x = ((edges[:-1] + edges[1:]) / 2).tolist()
    z = []
    for row in rows:
        points = np.asarray(row, dtype=np.float64).reshape(-1, 2)
        cell = np.clip(np.searchsorted(edges, points[:, 0], side="right") - 1, 0, columns - 1)
        sums = np.bincount(cell, weights=points[:, 1], minlength=columns)
        counts = np.bincount(cell, minlength=columns)
        z.append([float(s / n) if n else None for s, n in zip(sums, counts, strict=True)])
    return x, z


def heatmap(job: TrainingJob, layer: int | None = None, columns: int = COLUMNS) -> dict | None:
    """The chosen layer's heatmap (the first layer when none or an unknown
    one is asked for), or None for a job without expert-load metrics."""
    found = layers(job)
    if not found:
        return None
    if layer not in found:
        layer = next(iter(found))
    experts = found[layer]
    rows = [series.series(job.pk, f"moe/layer{layer}/expert{e}_load", columns)["points"]
            for e in experts]
    x, z = grid(rows, columns)
    dropped = series.series(job.pk, f"moe/layer{layer}/dropped", columns)["points"]
    return {"layers": list(found), "layer": layer, "experts": experts, "x": x, "z": z,
            "dropped": {"x": [p[0] for p in dropped], "y": [p[1] for p in dropped]}}
