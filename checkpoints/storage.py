"""Checkpoint storage as the control plane sees it.

The file layout and its checks belong to the worker package's storage
interface (`regatta.storage`: a filesystem path or S3, shared with the
ranks that write the checkpoints). On top of it, what only the control plane
does: verify a Checkpoint row against its manifest, delete one, and prune a
job's checkpoints (retention) so that a row is marked deleted only after its
files are gone, and neither the newest verified checkpoint nor a step the
caller protects is ever deleted.

Nothing here knows jobs: callers hand in the job's storage URI, its S3
options and the steps to protect (jobs/checkpointing/).
"""

from __future__ import annotations

from dataclasses import dataclass

from regatta.storage import open_storage

from controlplane.lib.errors import PermanentError, TemporaryError

from .models import Checkpoint

MIB = 1 << 20


@dataclass(frozen=True)
class S3Options:
    """How to reach S3 for one cluster's checkpoints; empty strings mean
    boto3's usual environment (AWS_REGION, AWS_ENDPOINT_URL, ...)."""

    region: str = ""
    endpoint_url: str = ""
    max_attempts: int = 5
    multipart_threshold_mb: float = 64.0


def s3_client(options: S3Options | None = None):
    import boto3  # only for S3 storage
    from botocore.config import Config

    options = options or S3Options()
    kwargs = {"config": Config(retries={"max_attempts": options.max_attempts,
                                        "mode": "standard"})}
    if options.region:
        kwargs["region_name"] = options.region
    if options.endpoint_url:
        kwargs["endpoint_url"] = options.endpoint_url
    return boto3.client("s3", **kwargs)


def open_uri(uri: str, s3: S3Options | None = None):
    """A `regatta.storage.Storage` for a path, file:// or s3:// URI."""
    try:
        if not uri.startswith("s3://"):
            return open_storage(uri)
        s3 = s3 or S3Options()
        return open_storage(uri, client=s3_client(s3),
                            multipart_threshold=int(s3.multipart_threshold_mb * MIB))
    except ValueError as exc:
        raise PermanentError(str(exc)) from exc


def _classified(what: str, exc: Exception) -> Exception:
    """Storage errors in the reconcilers' classes: throttling, 5xx and lost
    connections are temporary, denied access is permanent."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return exc
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", "")
        if status in (429, 503) or status >= 500 or code in ("SlowDown", "RequestTimeout"):
            return TemporaryError(f"{what}: {code}", delay=5.0)
        if status == 403 or code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId"):
            return PermanentError(f"{what}: {code}")
        return exc
    if isinstance(exc, BotoCoreError | OSError):
        return TemporaryError(f"{what}: {exc}", delay=5.0)
    return exc


def verify_checkpoint(checkpoint: Checkpoint, storage) -> tuple[bool, str]:
    """(ok, reason): the files of `checkpoint` against its manifest and marker,
    and the manifest against the checksum the trainer reported."""
    try:
        ok, reason = storage.verify(checkpoint.step)
        if ok and checkpoint.manifest_sha256:
            found = storage.manifest_sha256(checkpoint.step)
            if found != checkpoint.manifest_sha256:
                return False, (f"step-{checkpoint.step}: manifest checksum {found} differs "
                               f"from the reported {checkpoint.manifest_sha256}")
        return ok, reason
    except Exception as exc:
        mapped = _classified(f"verify step {checkpoint.step}", exc)
        if mapped is exc:
            raise
        raise mapped from exc


def delete_files(checkpoint: Checkpoint, storage) -> None:
    """Remove a checkpoint's files; raises unless storage holds none of them after."""
    try:
        storage.delete_step(checkpoint.step)
        left = storage.list_files(checkpoint.step) if checkpoint.step in (
            storage.list_steps()) else []
    except Exception as exc:
        mapped = _classified(f"delete step {checkpoint.step}", exc)
        if mapped is exc:
            raise
        raise mapped from exc
    if left:
        raise TemporaryError(f"step-{checkpoint.step}: {len(left)} files still in storage")


def retention_plan(job, protect=frozenset()) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """(keep, delete) among the job's rows that still have files.

    Kept: the newest `keep_last` loadable checkpoints, the newest verified one
    whatever its age, every step in `protect` (steps a restart is bound to,
    which only the caller knows), and every checkpoint newer than the newest
    loadable one (a save may be in flight). Everything older goes, corrupt
    ones included.
    """
    rows = list(Checkpoint.objects.filter(job=job).exclude(state=Checkpoint.State.DELETED)
                .order_by("-step"))
    loadable = [c for c in rows if c.state in Checkpoint.LOADABLE]
    if not loadable:
        return rows, []
    keep = {c.pk for c in loadable[:max(1, job.keep_last)]}
    verified = [c for c in loadable if c.state == Checkpoint.State.VERIFIED]
    if verified:
        keep.add(verified[0].pk)
    newest = loadable[0].step
    for c in rows:
        in_flight = c.step > newest and c.state != Checkpoint.State.ABANDONED
        if in_flight or c.state == Checkpoint.State.WRITING or c.step in protect:
            keep.add(c.pk)
    return [c for c in rows if c.pk in keep], [c for c in rows if c.pk not in keep]


def apply_retention(job, storage, protect=lambda: frozenset()) -> list[int]:
    """Prune one job's checkpoints; returns the steps deleted.

    The control plane is the one owner of deletion while a trainer reports to
    it (the trainer deletes nothing then: worker_image/trainer/checkpoint.py,
    `LeftToControlPlane`). Files go first, the row second: a row marked
    deleted never points at files that still exist, and a crash in between
    only leaves a row that the next sweep deletes again. Each checkpoint is
    planned again just before its files go, with `protect()` asked afresh,
    so one that a verification or a restart request made precious meanwhile
    is spared.
    """
    _, doomed = retention_plan(job, protect())
    deleted = []
    for checkpoint in doomed:
        job.refresh_from_db(fields=["keep_last"])
        if checkpoint.pk not in {c.pk for c in retention_plan(job, protect())[1]}:
            continue
        delete_files(checkpoint, storage)
        if checkpoint.transition(Checkpoint.State.DELETED,
                                 reason=f"retention: keep last {job.keep_last}"):
            deleted.append(checkpoint.step)
    return sorted(deleted)
