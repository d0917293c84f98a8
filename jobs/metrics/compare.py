"""Run comparison: several jobs' curves of one metric overlaid, by step or
by wall time, and their spec and hyperparameters side by side with the keys
that differ marked.

Each curve is the job page's own downsampled series (jobs/metrics/series.py: rollups
for a long series, never a scan of the raw points), so comparing ten
million-point jobs costs ten charts, not ten million rows. The jobs are
looked up through the caller's scope: one the caller may not see is not
found, exactly as on its own page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from django.db.models import Min

from jobs.metrics.models import MetricName
from jobs.metrics.series import DEFAULT_POINTS, effective_points_of, plan, series
from jobs.models import TrainingJob
from jobs.visibility import visible_jobs

MAX_JOBS = 10
# `jobs=12,15`: ids (at most 18 digits, within a bigint) separated by commas,
# at most MAX_JOBS of them; the API schema states the same pattern.
_JOB_ID = "[1-9][0-9]{0,17}"
JOB_IDS = re.compile(f"{_JOB_ID}(?:,{_JOB_ID}){{0,{MAX_JOBS - 1}}}")
JOB_IDS_PATTERN = f"^{JOB_IDS.pattern}$"
X_AXES = ("step", "time")
# Spec fields shown beside the hyperparameters: what most often explains why
# two runs' curves differ.
SPEC_KEYS = ("image", "entrypoint", "num_nodes", "gpus_per_node", "world_size", "strategy",
             "cluster", "priority", "spot_allowed")
# Nested hyperparameters are flattened to dotted keys down to this depth;
# deeper values are compared whole.
FLATTEN_DEPTH = 3


class JobsNotFound(LookupError):
    """Some asked-for jobs do not exist or are not the caller's to see."""

    def __init__(self, ids: list[int]):
        super().__init__(f"No such job: {', '.join(map(str, ids))}.")
        self.ids = ids


def parse_job_ids(raw: list[str]) -> list[int]:
    """Job ids from `12,15` (repeated values are joined with commas), in the
    order given, each once. Raises ValueError with a message for the `jobs`
    field."""
    text = ",".join(str(value) for value in raw)
    if not text:
        raise ValueError("Name at least one job, e.g. jobs=12,15.")
    if not JOB_IDS.fullmatch(text):
        if re.fullmatch(f"{_JOB_ID}(?:,{_JOB_ID})*", text):
            raise ValueError(f"At most {MAX_JOBS} jobs can be compared at once.")
        raise ValueError(f"Job ids separated by commas, e.g. jobs=12,15; not {text[:40]!r}.")
    return list(dict.fromkeys(int(part) for part in text.split(",")))


def scoped_jobs(user, ids: list[int]) -> list[TrainingJob]:
    found = {j.pk: j for j in visible_jobs(user).filter(pk__in=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise JobsNotFound(missing)
    return [found[i] for i in ids]


def metric_names(jobs: list[TrainingJob]) -> list[str]:
    """The union of the jobs' metric names, from the names table kept on ingest."""
    return sorted(set(MetricName.objects.filter(job__in=[j.pk for j in jobs])
                      .values_list("name", flat=True)))


def default_metric(names: list[str]) -> str:
    return "loss" if "loss" in names or not names else names[0]


def _flatten(value, prefix: str = "", depth: int = 0) -> dict:
    if isinstance(value, dict) and value and depth < FLATTEN_DEPTH:
        out = {}
        for key in sorted(value):
            out.update(_flatten(value[key], f"{prefix}{key}.", depth + 1))
        return out
    return {prefix.rstrip("."): value}


def spec_of(job: TrainingJob) -> dict:
    spec = {key: getattr(job, key) for key in SPEC_KEYS if key != "cluster"}
    spec["cluster"] = job.cluster.name
    return spec


def params(jobs: list[TrainingJob]) -> list[dict]:
    """One row per key: each job's value (None where it has none), and
    whether they differ. Hyperparameters first, then the spec fields."""
    columns = [{**{f"hyperparameters.{k}": v
                   for k, v in _flatten(job.hyperparameters or {}).items()},
                **{f"spec.{k}": v for k, v in spec_of(job).items()}} for job in jobs]
    keys = sorted({k for c in columns for k in c}, key=lambda k: (not k.startswith("hyper"), k))
    rows = []
    for key in keys:
        values = [c.get(key) for c in columns]
        present = [key in c for c in columns]
        differs = not all(present) or any(v != values[0] for v in values[1:])
        rows.append({"key": key, "values": values, "differs": differs})
    return rows


def _elapsed(job_id: int, name: str, steps: list[int]) -> list[float]:
    """Seconds from the series' first point to each step's point.

    A downsampled step of a long series is the middle of a rollup bucket and
    may not be a step anyone reported: its time is interpolated between the
    steps that were, the series' first and last points anchoring both ends.
    One indexed lookup of the wanted steps and two of the ends, however long
    the series."""
    chart = plan(job_id, name)
    if chart is None or not steps:
        return []
    points = effective_points_of(chart)
    known = dict(points.filter(step__in=steps).values("step").annotate(t=Min("time"))
                 .order_by().values_list("step", "t"))
    for end in (points.order_by("step", "rank"), points.order_by("-step", "rank")):
        row = end.values_list("step", "time").first()
        if row is not None:
            known.setdefault(row[0], row[1])
    if not known:
        return []
    at = np.array(sorted(known), dtype=np.float64)
    seconds = np.array([known[int(s)].timestamp() for s in at])
    return (np.interp(np.asarray(steps, dtype=np.float64), at, seconds) - seconds[0]).tolist()


def curve(job: TrainingJob, name: str, x: str, points: int) -> dict:
    data = series(job.pk, name, points)
    steps = [int(s) for s, _ in data["points"]]
    values = [v for _, v in data["points"]]
    xs = _elapsed(job.pk, name, steps) if x == "time" else steps
    last = {"step": steps[-1], "value": values[-1]} if steps else None
    return {"total": data["total"], "x": xs, "y": values, "steps": steps, "last": last}


@dataclass
class Comparison:
    jobs: list[TrainingJob]
    metric: str
    x: str
    points: int = DEFAULT_POINTS

    def as_dict(self) -> dict:
        names = metric_names(self.jobs)
        return {
            "metric": self.metric, "x": self.x, "metrics": names,
            "jobs": [{"id": job.pk, "name": job.name, "team": job.team.name,
                      "phase": job.phase, "current_step": job.current_step,
                      **curve(job, self.metric, self.x, self.points)} for job in self.jobs],
            "params": params(self.jobs),
        }
