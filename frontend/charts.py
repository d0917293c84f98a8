"""The job page's chart data: downsampled series plus the marks drawn on them.

Series are downsampled on the server (LTTB, in jobs.metrics.series, the same code the
API's metrics endpoint uses), so a job with a million points sends the
browser a few hundred per series.
"""

from checkpoints.models import Checkpoint
from frontend import expert_load
from jobs.metrics import series
from jobs.metrics.models import MetricPoint
from jobs.models import TrainingJob

POINTS = 600
# The trainer reports throughput under one of these names; the first present wins.
THROUGHPUT_NAMES = ("tokens_per_s", "samples_per_s")
MAX_CHECKPOINT_MARKS = 200


def _series(job: TrainingJob, name: str, points: int) -> dict:
    data = series.series(job.pk, name, points)
    return {
        "name": name, "total": data["total"],
        "x": [p[0] for p in data["points"]], "y": [p[1] for p in data["points"]],
    }


def throughput_name(job: TrainingJob) -> str:
    # One indexed existence probe per candidate: a DISTINCT over a million
    # points would cost more than the chart itself.
    for name in THROUGHPUT_NAMES:
        if MetricPoint.objects.filter(job=job, name=name).exists():
            return name
    return THROUGHPUT_NAMES[0]


def restart_marks(job: TrainingJob) -> list[dict]:
    """Where each attempt after the first resumed: the step it started from.

    Attempts that resumed from the same step share one mark, so a run of
    retries before the first checkpoint is one labelled line, not a pile of
    labels drawn over each other.
    """
    by_step: dict[int, list[int]] = {}
    rows = job.attempts.filter(number__gt=1).order_by("number").values_list(
        "number", "resume_step")
    for number, step in rows:
        by_step.setdefault(step or 0, []).append(number)
    return [{"step": step, "attempts": numbers, "label": _restart_label(numbers)}
            for step, numbers in sorted(by_step.items())]


def _restart_label(numbers: list[int]) -> str:
    if len(numbers) == 1:
        return f"attempt {numbers[0]}"
    if numbers[-1] - numbers[0] == len(numbers) - 1:
        return f"attempts {numbers[0]}–{numbers[-1]}"
    return f"{len(numbers)} attempts"


def checkpoint_marks(job: TrainingJob) -> list[dict]:
    rows = (
        job.checkpoints.exclude(state=Checkpoint.State.DELETED)
        .order_by("-step").values_list("step", "state", "emergency")[:MAX_CHECKPOINT_MARKS]
    )
    return [{"step": s, "state": st, "emergency": em} for s, st, em in rows]


def broken_at(series: dict, steps) -> dict:
    """The series with a gap (a null value, which plotly does not join
    across) just after each step where a later attempt resumed: throughput
    of one attempt says nothing about the next, and a line drawn across the
    restart would invent a ramp that never happened."""
    cuts = sorted({s + 0.5 for s in steps})
    if not cuts or not series["x"]:
        return series
    x, y = [], []
    pending = [c for c in cuts if series["x"][0] < c < series["x"][-1]]
    for sx, sy in zip(series["x"], series["y"], strict=True):
        while pending and pending[0] < sx:
            x.append(pending.pop(0))
            y.append(None)
        x.append(sx)
        y.append(sy)
    return {**series, "x": x, "y": y}


def chart_data(job: TrainingJob, points: int = POINTS, moe_layer: int | None = None) -> dict:
    throughput = throughput_name(job)
    restarts = restart_marks(job)
    return {
        "moe": expert_load.heatmap(job, moe_layer),
        "loss": _series(job, "loss", points),
        "val_loss": _series(job, "val_loss", points),
        "throughput": broken_at(_series(job, throughput, points),
                                [mark["step"] for mark in restarts]),
        "restarts": restarts,
        "checkpoints": checkpoint_marks(job),
    }
