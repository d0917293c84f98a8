"""Admission: which queued jobs may take nodes now, and why the others wait:
the logic is in `jobs/admission/queue.py`; the package's names are its door."""

from .queue import (  # noqa: F401
    WAKE_BATCH,
    AdmissionReport,
    admit,
    busy_node_ids,
    fleet_waiting,
    free_nodes_by_pool,
    jobs_on_nodes,
    note_position,
    queue_order,
    queue_position,
    quota_usage,
    request_admission,
)
