"""Evaluation runs on spare capacity: the logic is in `jobs/evals/runs.py`; the
package's names are its door."""

from .runs import (  # noqa: F401
    BUILTIN_KNOBS,
    EVAL_RESTART_BUDGETS,
    EVALUATED,
    LIVE,
    PARENT_EVENTS,
    cancel_live,
    eval_spec,
    metric_names,
    note_phase,
    picks,
    result_of,
    schedule,
    series_points,
    source_checkpoint,
)
