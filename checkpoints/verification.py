"""Which checkpoints may be resumed from: re-read them and check the manifest.

The trainer writes `manifest.json` and then `COMMITTED` (docs/trainer-protocol.md);
a row the trainer reported is `committed`. Before a resume the control plane
re-reads the files through `regatta.storage` and marks the row `verified` or
`corrupt`; a corrupt one is skipped for the previous good one. What a corrupt
checkpoint means for its job (an event on the timeline) is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

from django.utils import timezone

from .beneath import LinkRefused
from .models import Checkpoint
from .storage import verify_checkpoint

__all__ = ["newest_verified", "register_from_storage", "verify"]


def verify(checkpoint: Checkpoint, storage, now=None) -> tuple[bool, str]:
    """Re-read one checkpoint; store verified/corrupt with the reason.
    Returns (ok, reason); unreadable storage is not corruption: (False, reason)
    with the row left loadable."""
    now = now or timezone.now()
    try:
        ok, reason = verify_checkpoint(checkpoint, storage)
    except Exception as exc:  # unreadable storage is no proof of corruption
        checkpoint.state_reason = f"could not read: {exc}"[:300]
        Checkpoint.objects.filter(pk=checkpoint.pk).update(state_reason=checkpoint.state_reason)
        return False, checkpoint.state_reason
    # A row abandoned or deleted while its files were read stays so.
    checkpoint.transition(Checkpoint.State.VERIFIED if ok else Checkpoint.State.CORRUPT,
                          reason=reason or "", verified_at=now if ok else None)
    return ok, reason


def register_from_storage(job, storage, now=None) -> list[Checkpoint]:
    """Rows for committed steps found in storage but never reported (a report
    lost with its rank); they start as committed and are verified on use."""
    now = now or timezone.now()
    known = set(Checkpoint.objects.filter(job=job).values_list("step", flat=True))
    made = []
    for step in storage.committed_steps():
        if step in known:
            continue
        try:
            manifest = storage.read_manifest(step) or {}
            manifest_sha256 = storage.manifest_sha256(step) or ""
        except LinkRefused:  # a linked manifest is some other folder's
            continue
        files = manifest.get("files", {})
        row, created = Checkpoint.objects.get_or_create(
            job=job, step=step,
            defaults={
                "uri": storage.step_uri(step),
                "bytes": sum(int(f.get("bytes", 0)) for f in files.values()),
                "manifest_sha256": manifest_sha256,
                "state": Checkpoint.State.COMMITTED,
                "state_reason": "found in storage",
                "created_at": now,
            },
        )
        if created:
            made.append(row)
    return made


def newest_verified(job, storage, now=None, at_most: int | None = None,
                    on_corrupt: Callable[[Checkpoint, str], None] | None = None,
                    ) -> Checkpoint | None:
    """The newest loadable checkpoint (at or below `at_most`) that verifies;
    `on_corrupt(checkpoint, reason)` hears of each one that failed."""
    now = now or timezone.now()
    register_from_storage(job, storage, now)
    candidates = Checkpoint.objects.filter(job=job, state__in=Checkpoint.LOADABLE)
    if at_most is not None:
        candidates = candidates.filter(step__lte=at_most)
    for checkpoint in candidates.order_by("-step"):
        ok, reason = verify(checkpoint, storage, now)
        if ok:
            return checkpoint
        if checkpoint.state == Checkpoint.State.CORRUPT and on_corrupt is not None:
            on_corrupt(checkpoint, reason)
    return None
