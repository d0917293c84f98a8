"""Profiling on demand: the logic is in `jobs/profiling/traces.py`; the
package's names are its door."""

from .traces import (  # noqa: F401
    MAX_PROFILE_STEPS,
    TraceReport,
    record_trace,
    report_errors,
    traces_of,
)
