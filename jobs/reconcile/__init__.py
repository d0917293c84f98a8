"""The job reconcile: the logic is in `jobs/reconcile/job_pass.py`; the
package's names are its door."""

from .job_pass import (  # noqa: F401
    ERROR_CONDITION,
    IDLE_REQUEUE_S,
    JOBS,
    STRAGGLERS_FOR,
    due_job_ids,
    reconcile_job_locked,
    reconcile_job_unlocked,
)
