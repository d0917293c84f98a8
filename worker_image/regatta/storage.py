"""Where checkpoints live: a filesystem path or S3, behind one small interface.

Standard library only (boto3 for S3, imported when an s3:// URI is opened:
the `s3` extra).

Keys are relative to the checkpoint root, e.g. ``step-200/manifest.json``.
The control plane uses this module (without torch) to list, verify and prune
checkpoints:

    store = open_storage("s3://bucket/runs/42")
    for step in reversed(store.list_steps()):
        ok, reason = store.verify(step)

Filesystem (local disk, NFS, FSx for Lustre): DCP writes the shards straight
into ``step-N/``. S3: every rank writes its shards to a local staging folder
and uploads them (multipart above ``multipart_threshold``); a load downloads
the step to a staging folder first. See docs/trainer.md.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from regatta import manifest as mf

STEP_RE = re.compile(r"^step-(\d+)$")
# User metadata of an uploaded file: its SHA-256 (hex), as the uploader hashed
# it, for objects whose S3 checksum is a composite of their parts.
SHA256_META = "regatta-sha256"


class StorageError(RuntimeError):
    """Storage refused part of an operation (e.g. some deletes of a batch)."""


def step_name(step: int) -> str:
    return f"step-{step}"


def profile_key(start_step: int, request_id: str, rank: int) -> str:
    """Where a rank's profiler trace lives, beside the checkpoints: one
    folder per profile (its first step and request id, so a replayed step
    never overwrites an earlier profile), one gzipped Chrome trace per rank."""
    return f"profiles/step-{start_step}-{request_id}/rank-{rank}.json.gz"


class Storage:
    """Common logic over a handful of primitives each backend implements."""

    uri: str

    # -- primitives -------------------------------------------------------
    def read_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def write_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def create_once(self, key: str, data: bytes) -> bool:
        """Write `key` only if no object has that name yet, atomically: True
        for the one caller that created it, False for every other."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        raise NotImplementedError

    def sha256(self, key: str) -> str:
        raise NotImplementedError

    def list_steps(self) -> list[int]:
        """Every ``step-N`` folder, committed or not, oldest first."""
        raise NotImplementedError

    def list_files(self, step: int) -> list[str]:
        """Paths relative to ``step-N/`` of every file in that folder."""
        raise NotImplementedError

    def delete_step(self, step: int) -> None:
        raise NotImplementedError

    def list_keys(self, prefix: str) -> list[str]:
        """Keys of the files under `prefix` (a folder, ending in /)."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def upload_file(self, local: str | Path, key: str) -> None:
        raise NotImplementedError

    def download_file(self, key: str, local: str | Path) -> None:
        raise NotImplementedError

    def local_dir(self, step: int) -> Path | None:
        """A directory DCP can write into directly, or None (stage and upload)."""
        return None

    # -- shared logic -------------------------------------------------------
    def step_uri(self, step: int) -> str:
        return f"{self.uri.rstrip('/')}/{step_name(step)}"

    def read_optional(self, key: str) -> bytes | None:
        try:
            return self.read_bytes(key)
        except FileNotFoundError:
            return None

    def is_committed(self, step: int) -> bool:
        return self.exists(f"{step_name(step)}/{mf.MARKER}")

    def committed_steps(self) -> list[int]:
        """Steps with a commit marker (not re-hashed), oldest first."""
        return [s for s in self.list_steps() if self.is_committed(s)]

    def read_manifest(self, step: int) -> dict[str, Any] | None:
        data = self.read_optional(f"{step_name(step)}/{mf.MANIFEST}")
        return None if data is None else mf.parse_manifest(data)

    def manifest_sha256(self, step: int) -> str | None:
        data = self.read_optional(f"{step_name(step)}/{mf.MANIFEST}")
        return None if data is None else mf.sha256_bytes(data)

    def verify(self, step: int, deep: bool = True) -> tuple[bool, str]:
        """(ok, reason). deep=False checks presence and sizes, not checksums."""
        prefix = step_name(step)
        return mf.check(
            step,
            self.read_optional(f"{prefix}/{mf.MANIFEST}"),
            self.read_optional(f"{prefix}/{mf.MARKER}"),
            lambda rel: self.size(f"{prefix}/{rel}"),
            (lambda rel: self.sha256(f"{prefix}/{rel}")) if deep else None,
        )

    def newest_verified(
        self,
        at_most: int | None = None,
        on_skip: Callable[[int, str], None] | None = None,
    ) -> int | None:
        """The newest step (<= at_most) that verifies; reports each one skipped."""
        for step in reversed(self.list_steps()):
            if at_most is not None and step > at_most:
                continue
            ok, reason = self.verify(step)
            if ok:
                return step
            if on_skip is not None:
                on_skip(step, reason)
        return None

    def apply_retention(self, keep_last: int, protect: Iterable[int] = ()) -> list[int]:
        """Delete all but the newest `keep_last` committed steps; returns deleted.

        Uncommitted folders older than the newest committed one are abandoned
        saves and go too; newer ones may be a save in flight and stay. The
        newest committed step is never deleted, whatever keep_last says.
        """
        steps = self.list_steps()
        committed = [s for s in steps if self.is_committed(s)]
        if not committed:
            return []
        keep = set(committed[-max(1, keep_last):]) | set(protect)
        newest = committed[-1]
        doomed = [s for s in steps if s < newest and s not in keep]
        for step in doomed:
            self.delete_step(step)
        return doomed

    def upload_dir(self, local_root: str | Path, step: int, relpaths: Iterable[str]) -> None:
        for rel in relpaths:
            self.upload_file(Path(local_root) / rel, f"{step_name(step)}/{rel}")

    def download_step(self, step: int, local_root: str | Path) -> Path:
        local_root = Path(local_root)
        for rel in self.list_files(step):
            self.download_file(f"{step_name(step)}/{rel}", local_root / rel)
        return local_root


class LocalStorage(Storage):
    """A directory: local disk, NFS or FSx for Lustre (shared by all nodes)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).absolute()
        self.uri = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / key

    def read_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so a reader never sees half a marker or manifest.
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def sha256(self, key: str) -> str:
        return mf.sha256_file(self._path(key))[0]

    def list_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        found = (STEP_RE.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def list_files(self, step: int) -> list[str]:
        base = self._path(step_name(step))
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())

    def delete_step(self, step: int) -> None:
        shutil.rmtree(self._path(step_name(step)), ignore_errors=True)

    def list_keys(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        # Dot files are writes in progress (write_bytes renames them into place).
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith(".")) if base.is_dir() else []

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def upload_file(self, local: str | Path, key: str) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, dest)

    def download_file(self, key: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(key), local)

    def create_once(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def local_dir(self, step: int) -> Path:
        return self._path(step_name(step))


class S3Storage(Storage):
    """s3://bucket/prefix. Credentials and endpoint come from boto3's usual
    environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)."""

    def __init__(self, bucket: str, prefix: str, multipart_threshold: int = 64 << 20,
                 client: Any = None):
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.client = client or boto3.client("s3")
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=max(multipart_threshold, 5 << 20),
            max_concurrency=8,
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read_bytes(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(key) from None

    def write_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                               ChecksumAlgorithm="SHA256")

    def create_once(self, key: str, data: bytes) -> bool:
        """S3's conditional write (`If-None-Match: *`): 412 when the object
        exists, 409 when a concurrent conditional write to it is under way."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                   IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in (
                    "PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return int(head["ContentLength"])

    def sha256(self, key: str) -> str:
        """S3's own checksum where the object has one, else the bytes re-read:
        a 4 GB checkpoint verifies in one HEAD per file, not 4 GB of reads."""
        stored = self.stored_sha256(key)
        if stored is not None:
            return stored
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        h = hashlib.sha256()
        for chunk in body.iter_chunks(4 << 20):
            h.update(chunk)
        return h.hexdigest()

    def stored_sha256(self, key: str) -> str | None:
        """The object's SHA-256 (hex) as S3 keeps it, without reading it.

        A single-part upload with ChecksumAlgorithm=SHA256 carries the whole
        object's SHA-256, which S3 checked on receipt. A multipart upload
        carries a composite (a SHA-256 of its parts' SHA-256s, each checked
        by S3 on receipt), not comparable with a file's own hash; then the
        hash the uploader took of the same local file, in its metadata,
        stands for it. None: no S3 checksum (an object written by another
        tool, or changed since by one), so only a re-read can tell."""
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(key),
                                       ChecksumMode="ENABLED")
        value = head.get("ChecksumSHA256")
        if not value:
            return None
        composite = (head.get("ChecksumType") == "COMPOSITE" or "-" in value
                     or "-" in head.get("ETag", ""))
        if not composite:
            return base64.b64decode(value.encode()).hex()
        return (head.get("Metadata") or {}).get(SHA256_META)

    def _list(self, prefix: str, delimiter: str | None = None):
        paginator = self.client.get_paginator("list_objects_v2")
        kwargs = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        yield from paginator.paginate(**kwargs)

    def list_steps(self) -> list[int]:
        base = f"{self.prefix}/" if self.prefix else ""
        steps = []
        for page in self._list(base, "/"):
            for cp in page.get("CommonPrefixes", []):
                m = STEP_RE.match(cp["Prefix"][len(base):].rstrip("/"))
                if m:
                    steps.append(int(m.group(1)))
        return sorted(steps)

    def list_files(self, step: int) -> list[str]:
        base = self._key(step_name(step)) + "/"
        return sorted(
            obj["Key"][len(base):]
            for page in self._list(base)
            for obj in page.get("Contents", [])
        )

    def delete_step(self, step: int) -> None:
        """Every version of every object of the step, and its delete markers:
        on a versioned bucket a plain delete only hides the objects, and
        nothing is freed. Raises StorageError if S3 refused any delete."""
        base = self._key(step_name(step)) + "/"
        errors: list[dict] = []
        pages = self.client.get_paginator("list_object_versions").paginate(
            Bucket=self.bucket, Prefix=base)
        for page in pages:
            objs = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
            if objs:  # a page holds at most 1000, delete_objects' limit
                reply = self.client.delete_objects(Bucket=self.bucket,
                                                   Delete={"Objects": objs, "Quiet": True})
                errors.extend(reply.get("Errors", []))
        if errors:
            first = errors[0]
            raise StorageError(
                f"s3://{self.bucket}/{base}: {len(errors)} deletes refused, e.g. "
                f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}".strip())

    def list_keys(self, prefix: str) -> list[str]:
        skip = len(self._key(""))
        return sorted(obj["Key"][skip:] for page in self._list(self._key(prefix))
                      for obj in page.get("Contents", []))

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def upload_file(self, local: str | Path, key: str) -> None:
        # S3 checks every part against its SHA-256 on receipt and keeps the
        # checksum, so verification needs no re-read (stored_sha256).
        digest = mf.sha256_file(local)[0]
        self.client.upload_file(str(local), self.bucket, self._key(key), Config=self.transfer,
                                ExtraArgs={"ChecksumAlgorithm": "SHA256",
                                           "Metadata": {SHA256_META: digest}})

    def download_file(self, key: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(key), str(local), Config=self.transfer)


def open_storage(uri: str, **kwargs: Any) -> Storage:
    """A path, ``file:///path`` or ``s3://bucket/prefix``."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"no bucket in {uri!r}")
        return S3Storage(parsed.netloc, parsed.path, **kwargs)
    if parsed.scheme == "file":
        return LocalStorage(parsed.path)
    if parsed.scheme == "":
        return LocalStorage(uri)
    raise ValueError(f"unsupported checkpoint URI scheme {parsed.scheme!r} in {uri!r}")
