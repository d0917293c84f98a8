"""Who deletes checkpoints: one owner at a time (docs/sdk.md, "Retention")."""

from __future__ import annotations

import logging

from regatta.storage import Storage

log = logging.getLogger("regatta.checkpoint")


class KeepLast:
    """Standalone retention: after each commit rank 0 keeps the newest
    `keep_last` committed steps (Storage.apply_retention)."""

    def __init__(self, keep_last: int):
        self.keep_last = keep_last

    def apply(self, storage: Storage) -> list[int]:
        deleted = storage.apply_retention(self.keep_last)
        if deleted:
            log.info("retention (keep_last=%d) deleted steps %s", self.keep_last, deleted)
        return deleted


class LeftToControlPlane:
    """Retention while reporting to a control plane: the SDK deletes nothing.

    Only the control plane knows which checkpoint it verified last and which
    step a person pinned as a restart point, so it alone prunes
    (checkpoints/storage.py's `apply_retention`, fed by the checkpoint reports). A rank
    pruning by count could delete the very step the next attempt is told
    to resume from.
    """

    def apply(self, storage: Storage) -> list[int]:
        return []


def retention_for(managed: bool, keep_last: int) -> KeepLast | LeftToControlPlane:
    return LeftToControlPlane() if managed else KeepLast(keep_last)
