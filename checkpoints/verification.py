"""Which checkpoints may be resumed from: re-read them and check the manifest.

The trainer writes `manifest.json` and then `COMMITTED` (docs/trainer-protocol.md);
a row the trainer reported is `committed`. Before a resume the control plane
re-reads the files through `trainer.storage` and marks the row `verified` or
`corrupt`; a corrupt one is skipped for the previous good one.
"""

from __future__ import annotations

from django.utils import timezone

from .models import Checkpoint
from .storage import job_checkpoint_uri, open_job_storage, verify_checkpoint

__all__ = ["job_checkpoint_uri", "newest_verified", "open_job_storage", "register_from_storage",
           "verify"]


def verify(checkpoint: Checkpoint, now=None, storage=None) -> bool:
    """Re-read one checkpoint; store verified/corrupt with the reason."""
    now = now or timezone.now()
    storage = storage or open_job_storage(checkpoint.job)
    try:
        ok, reason = verify_checkpoint(checkpoint, storage)
    except Exception as exc:  # unreadable storage is no proof of corruption
        checkpoint.state_reason = f"could not read: {exc}"[:300]
        Checkpoint.objects.filter(pk=checkpoint.pk).update(state_reason=checkpoint.state_reason)
        return False
    state = Checkpoint.State.VERIFIED if ok else Checkpoint.State.CORRUPT
    Checkpoint.objects.filter(pk=checkpoint.pk, state__in=Checkpoint.LOADABLE).update(
        state=state, state_reason=(reason or "")[:300], verified_at=now if ok else None
    )
    checkpoint.refresh_from_db()
    if not ok:
        checkpoint.job.record(
            "CheckpointCorrupt", f"step {checkpoint.step} failed verification: {reason}",
            evidence={"step": checkpoint.step, "uri": checkpoint.uri, "reason": reason}, now=now,
        )
    return ok


def register_from_storage(job, now=None, storage=None) -> list[Checkpoint]:
    """Rows for committed steps found in storage but never reported (a report
    lost with its rank); they start as committed and are verified on use."""
    now = now or timezone.now()
    storage = storage or open_job_storage(job)
    known = set(Checkpoint.objects.filter(job=job).values_list("step", flat=True))
    made = []
    for step in storage.committed_steps():
        if step in known:
            continue
        manifest = storage.read_manifest(step) or {}
        files = manifest.get("files", {})
        row, created = Checkpoint.objects.get_or_create(
            job=job, step=step,
            defaults={
                "uri": storage.step_uri(step),
                "bytes": sum(int(f.get("bytes", 0)) for f in files.values()),
                "manifest_sha256": storage.manifest_sha256(step) or "",
                "state": Checkpoint.State.COMMITTED,
                "state_reason": "found in storage",
                "created_at": now,
            },
        )
        if created:
            made.append(row)
    return made


def newest_verified(job, now=None, at_most: int | None = None) -> Checkpoint | None:
    """The newest loadable checkpoint (at or below `at_most`) that verifies."""
    now = now or timezone.now()
    storage = open_job_storage(job)
    register_from_storage(job, now, storage)
    candidates = Checkpoint.objects.filter(job=job, state__in=Checkpoint.LOADABLE)
    if at_most is not None:
        candidates = candidates.filter(step__lte=at_most)
    for checkpoint in candidates.order_by("-step"):
        if verify(checkpoint, now, storage):
            return checkpoint
    return None
