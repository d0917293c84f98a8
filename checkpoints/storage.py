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

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from regatta.storage import STEP_RE, LocalStorage, open_storage, step_name

from controlplane.lib.errors import PermanentError, TemporaryError

from . import beneath
from .beneath import LinkRefused
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


class ConfinedLocalStorage(LocalStorage):
    """A job's folder on a filesystem, read as the control plane must read
    a folder its job's code can write in: no symbolic link below `base`
    (the deployment root the folder lies under) is ever followed, in the
    job's folder, a step folder, or a file (checkpoints/beneath.py). A link
    reads as LinkRefused where a file is asked for, is left out of listings
    (a step folder that is a link is no step; a linked shard is missing), and
    retention deletes the link itself, never what it points at."""

    def __init__(self, root: str | Path, base: str | Path):
        super().__init__(root)
        self.base = os.path.realpath(base)
        below = os.path.relpath(self.root, Path(base).absolute())
        self.below = "" if below == "." else below

    def _rel(self, key: str) -> str:
        return f"{self.below}/{key}" if self.below else key

    def _path(self, key: str) -> Path:
        # The inherited writers go through here: the same rule, checked by
        # resolving the path (they are the trainer's, not the control plane's).
        path = self.root / key
        expected = os.path.join(self.base, self._rel(key))
        if os.path.realpath(path) != os.path.normpath(expected):
            raise LinkRefused(f"{path} passes through a symbolic link; it is not followed")
        return path

    def open_stream(self, key: str) -> tuple[IO[bytes], int]:
        fd = beneath.open_file(self.base, self._rel(key))
        return os.fdopen(fd, "rb"), os.fstat(fd).st_size

    def read_bytes(self, key: str) -> bytes:
        stream, _ = self.open_stream(key)
        with stream:
            return stream.read()

    def size(self, key: str) -> int | None:
        try:
            stream, size = self.open_stream(key)
        except FileNotFoundError:
            return None
        stream.close()
        return size

    def sha256(self, key: str) -> str:
        stream, _ = self.open_stream(key)
        with stream:
            return hashlib.file_digest(stream, "sha256").hexdigest()

    def is_committed(self, step: int) -> bool:
        try:
            return super().is_committed(step)
        except LinkRefused:  # a linked marker commits nothing
            return False

    def _folder(self, key: str = "") -> int | None:
        try:
            return beneath.open_dir(self.base, self._rel(key) if key else self.below)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def list_steps(self) -> list[int]:
        fd = self._folder()
        if fd is None:
            return []
        try:
            found = (STEP_RE.match(e.name) for e in beneath.entries(fd)
                     if e.is_dir(follow_symlinks=False))
            return sorted(int(m.group(1)) for m in found if m)
        finally:
            os.close(fd)

    def list_files(self, step: int) -> list[str]:
        fd = self._folder(step_name(step))
        if fd is None:
            return []
        try:
            return sorted(beneath.walk_files(fd))
        finally:
            os.close(fd)

    def list_keys(self, prefix: str) -> list[str]:
        fd = self._folder(prefix.rstrip("/"))
        if fd is None:
            return []
        try:
            # Dot files are writes in progress (write_bytes renames them into place).
            return sorted(f"{prefix.rstrip('/')}/{rel}" for rel in beneath.walk_files(fd)
                          if not rel.rsplit("/", 1)[-1].startswith("."))
        finally:
            os.close(fd)

    def delete_step(self, step: int) -> None:
        fd = self._folder()
        if fd is None:
            return
        name = step_name(step)
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                # With dir_fd, rmtree works through descriptors and unlinks
                # the links it meets instead of following them.
                shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
            else:  # a link (or a stray file) in the step's place: only it goes
                os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        folder, _, name = key.rpartition("/")
        fd = self._folder(folder)
        if fd is None:
            return
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def download_file(self, key: str, local: str | Path) -> None:
        stream, _ = self.open_stream(key)
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with stream, open(local, "wb") as out:
            shutil.copyfileobj(stream, out)


def open_uri(uri: str, s3: S3Options | None = None, confined_to: str | None = None):
    """A `regatta.storage.Storage` for a path, file:// or s3:// URI. A
    filesystem path with `confined_to` (a folder at or above it) is read
    without following any link below that folder (ConfinedLocalStorage)."""
    try:
        if not uri.startswith("s3://"):
            storage = open_storage(uri)
            if confined_to is not None and isinstance(storage, LocalStorage):
                return ConfinedLocalStorage(storage.root, confined_to)
            return storage
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
    except LinkRefused as exc:  # not this job's files, whatever they hold
        return False, f"step-{checkpoint.step}: {exc}"
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
    it (the trainer deletes nothing then: worker_image/regatta/retention.py,
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
