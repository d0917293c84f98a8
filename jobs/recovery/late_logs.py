"""A failed rank's log read after the failure, for the record.

The failure was acted on without it (the provider could not read it then,
and said so in the failure's evidence); the cluster pass reads it once more
later (clusters/reconcile/late_logs.py) and hands it here: the job's
timeline gets a `LogReadLater` event with the program's own error line
(signature.user_error) and the log's tail, or `LogUnreadable` saying it
could not be read a second time either. Idempotent per attempt and rank.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from jobs.models import JobAttempt

from .signature import user_error

READ_LATER = "LogReadLater"
UNREADABLE = "LogUnreadable"


def record(late, now) -> None:
    """Write `late` (a clusters.providers.base.LateLog) on its job's timeline."""
    attempt = (JobAttempt.objects.select_related("job").filter(pk=late.attempt_id).first()
               if late.attempt_id is not None else None)
    if attempt is None or attempt.job_id != late.job_id:
        return  # its job is gone (deleted since): nobody to tell
    job = attempt.job
    rank = "?" if late.node_rank is None else late.node_rank
    where = f"node rank {rank} on {late.node or 'an unknown node'}"
    evidence = {"node": late.node, "node_rank": late.node_rank,
                "unreadable_at_failure": late.first_unreachable, "kept_s": round(late.kept_s)}
    if late.text:
        error = user_error(late.text)
        said = error.line if error else late.text.strip().splitlines()[-1][:300]
        kind = READ_LATER
        message = (f"attempt {attempt.number}: the log of {where}, unreadable when the failure "
                   f"was acted on, read {late.kept_s:.0f} s later: {said}")
        evidence.update(log_tail=late.text[-4000:],
                        **({"error": error.as_evidence()} if error else {}))
    else:
        kind = UNREADABLE
        message = (f"attempt {attempt.number}: the log of {where} could not be read "
                   f"{late.kept_s:.0f} s later either: {late.unreachable}")
        evidence["unreachable"] = late.unreachable
    key = f"late-log:{attempt.pk}:{late.node_rank}:{late.node}"[:100]
    try:
        with transaction.atomic():
            job.record(kind, message[:1000], attempt=attempt, now=now, evidence=evidence,
                       key=key)
    except IntegrityError:
        pass  # recorded by an earlier pass
