"""Checkpoint retention sweep: every job with checkpoints gets the pruning
of checkpoints.storage.apply_retention (keep the newest `keep_last`, never
the newest verified one nor one a person asked to restart from).

The trainer's rank 0 prunes its own folder as it goes; this sweep catches
what it could not (a job that ended, a rank that died mid-prune) and keeps
the rows in step with storage.
"""

from __future__ import annotations

import logging

from .models import Checkpoint
from .storage import apply_retention

log = logging.getLogger(__name__)


def sweep(now) -> int:
    from jobs.models import TrainingJob

    total = 0
    jobs = TrainingJob.objects.filter(checkpoints__state__in=Checkpoint.LOADABLE).distinct()
    for job in jobs:
        try:
            total += len(apply_retention(job, now))
        except Exception as exc:  # one job's storage trouble must not stop the sweep
            log.warning("retention for job %s failed: %s", job.pk, exc)
    return total
