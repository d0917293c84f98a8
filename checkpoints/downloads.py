"""The files of an exported model or a checkpoint, as a person downloads them.

Two places hold them:
- an artifact's copy in the registry (settings.ARTIFACT_ROOT,
  `<name>/v<version>/`, written by checkpoints/export.py), always a local
  folder;
- a checkpoint's `step-N/` folder in its job's storage, a local path or S3
  (`regatta.storage`, opened through checkpoints/storage.py).

A requested path is a relative path as the listing spells it, never trusted
as a filesystem path: an empty, absolute, `.` or `..` segment, a backslash or
a NUL is refused before anything is opened (`clean_relpath`), only a path the
listing names is opened, and on local disk every component below the trusted
folder (the registry, the storage root) is opened without following a link
(checkpoints/beneath.py) and the file must be a regular one. Everything
refused reads as "not found" to the caller; a step folder that is a link
reads as LinkRefused, which the views answer with 409.

Nothing here knows people or teams: the views decide who may ask.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings
from regatta import manifest as mf
from regatta.storage import LocalStorage, S3Storage, step_name

from . import beneath
from .beneath import LinkRefused
from .export import MODEL_FILE
from .storage import ConfinedLocalStorage

CHUNK = 1 << 20


@dataclass(frozen=True)
class FileInfo:
    path: str  # relative to the artifact's folder or the checkpoint's step-N/
    bytes: int
    sha256: str  # "" where neither the export nor the manifest recorded one


@dataclass
class OpenedFile:
    """A readable binary stream and its size; the caller closes it."""

    stream: IO[bytes]
    size: int
    sha256: str


class NotThere(LookupError):
    """No such file for the caller: a bad path, one outside the folder, a
    link, or simply absent."""


def clean_relpath(path: str) -> str | None:
    """`path` when it is a plain relative path (`a/b.pt`), else None."""
    if not isinstance(path, str) or not path or len(path) > 1000:
        return None
    if "\x00" in path or "\\" in path or path.startswith("/"):
        return None
    if any(part in ("", ".", "..") for part in path.split("/")):
        return None
    return path


def open_confined(base: str, relpath: str) -> tuple[IO[bytes], int]:
    """Open `base/relpath` for reading, no component below `base` a link,
    if it is a regular file; NotThere otherwise."""
    rel = clean_relpath(relpath)
    if rel is None:
        raise NotThere(relpath)
    try:
        fd = beneath.open_file(base, rel)
    except (OSError, LinkRefused):
        raise NotThere(relpath) from None
    return os.fdopen(fd, "rb"), os.fstat(fd).st_size


# -- artifacts ------------------------------------------------------------

def artifact_folder(artifact) -> Path | None:
    """The artifact's folder in the registry, or None when its row points
    anywhere else (a folder outside settings.ARTIFACT_ROOT is never served).

    The export records the model file for a `torch` artifact and the folder
    otherwise (checkpoints/export.py)."""
    uri = artifact.uri or ""
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not uri.startswith("/"):
        return None
    path = Path(os.path.normpath(uri))
    folder = path.parent if artifact.format == "torch" and path.name == MODEL_FILE else path
    root = Path(settings.ARTIFACT_ROOT).absolute()
    if folder == root or not folder.is_relative_to(root):
        return None
    # Its real path too, so no link below the registry leads elsewhere.
    if os.path.realpath(folder) != os.path.join(os.path.realpath(root),
                                                str(folder.relative_to(root))):
        return None
    return folder


def artifact_files(artifact) -> list[FileInfo]:
    """Every file of the artifact, by path. The export's listing (with each
    file's sha256) when the row has one, else what its folder holds now."""
    if artifact.files:
        return sorted(
            (FileInfo(rel, int(e.get("bytes", 0)), str(e.get("sha256", "")))
             for rel, e in artifact.files.items() if clean_relpath(rel)),
            key=lambda f: f.path,
        )
    folder = artifact_folder(artifact)
    if folder is None or not folder.is_dir():
        return []
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and clean_relpath(rel):
            found.append(FileInfo(rel, path.stat().st_size, ""))
    return sorted(found, key=lambda f: f.path)


def open_artifact_file(artifact, relpath: str) -> OpenedFile:
    listed = {f.path: f for f in artifact_files(artifact)}
    folder = artifact_folder(artifact)
    if clean_relpath(relpath) is None or relpath not in listed or folder is None:
        raise NotThere(relpath)
    root = Path(settings.ARTIFACT_ROOT).absolute()
    stream, size = open_confined(os.path.realpath(root),
                                 f"{folder.relative_to(root).as_posix()}/{relpath}")
    return OpenedFile(stream, size, listed[relpath].sha256)


# -- checkpoints ----------------------------------------------------------

def checkpoint_files(step: int, storage) -> list[FileInfo]:
    """The files of `step-N/`: those the manifest lists, with their sha256,
    then the manifest and the commit marker themselves. NotThere when the
    step has no manifest in storage."""
    manifest = storage.read_manifest(step)
    if not manifest:
        raise NotThere(step_name(step))
    files = [FileInfo(rel, int(e.get("bytes", 0)), str(e.get("sha256", "")))
             for rel, e in (manifest.get("files") or {}).items() if clean_relpath(rel)]
    for own in (mf.MANIFEST, mf.MARKER):
        size = storage.size(f"{step_name(step)}/{own}")
        if size is not None:
            files.append(FileInfo(own, size, ""))
    return sorted(files, key=lambda f: f.path)


def open_checkpoint_file(step: int, storage, relpath: str) -> OpenedFile:
    """One file of `step-N/` that the listing names: read from disk inside
    the step folder, or the S3 object's body, streamed as it arrives."""
    if clean_relpath(relpath) is None:
        raise NotThere(relpath)
    listed = {f.path: f for f in checkpoint_files(step, storage)}
    if relpath not in listed:
        raise NotThere(relpath)
    return open_storage_file(storage, f"{step_name(step)}/{relpath}", listed[relpath].sha256)


def open_storage_file(storage, key: str, sha256: str = "") -> OpenedFile:
    """The file at `key` (a clean relative path) in a storage: read from
    disk confined to the storage's folder, or the S3 object's body, streamed
    as it arrives. The caller decides which keys may be asked for."""
    if clean_relpath(key) is None:
        raise NotThere(key)
    if isinstance(storage, ConfinedLocalStorage):
        try:
            stream, size = storage.open_stream(key)
        except (OSError, LinkRefused):
            raise NotThere(key) from None
        return OpenedFile(stream, size, sha256)
    if isinstance(storage, LocalStorage):
        stream, size = open_confined(os.path.realpath(storage.root), key)
        return OpenedFile(stream, size, sha256)
    if isinstance(storage, S3Storage):
        full = f"{storage.prefix}/{key}" if storage.prefix else key
        try:
            obj = storage.client.get_object(Bucket=storage.bucket, Key=full)
        except storage.client.exceptions.NoSuchKey:
            raise NotThere(key) from None
        return OpenedFile(obj["Body"], int(obj["ContentLength"]), sha256)
    raise NotThere(key)  # pragma: no cover - no third kind of storage


def iter_chunks(stream: IO[bytes], chunk: int = CHUNK) -> Iterator[bytes]:
    try:
        while data := stream.read(chunk):
            yield data
    finally:
        stream.close()
