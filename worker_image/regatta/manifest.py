"""Checkpoint manifests and commit markers; no torch, no process group needed.

A `step-N/` folder counts only when `COMMITTED` exists, holds the sha256 of
`manifest.json`, and every file the manifest lists has its recorded size and
sha256. The control plane imports this (through `regatta.storage`, without
torch) to verify checkpoints; the SDK uses it to build them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MARKER = "COMMITTED"
_CHUNK = 4 << 20


def sha256_file(path: str | Path) -> tuple[str, int]:
    """(hex digest, size in bytes) of a local file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_local_files(root: str | Path, relpaths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Manifest entries for files under `root`, keyed by their relative path."""
    root = Path(root)
    entries = {}
    for rel in relpaths:
        digest, size = sha256_file(root / rel)
        entries[rel] = {"sha256": digest, "bytes": size}
    return entries


def build_manifest(step: int, files: dict[str, dict[str, Any]]) -> bytes:
    """Canonical bytes (sorted keys), so the marker's checksum is reproducible."""
    for rel in files:
        if rel in (MANIFEST, MARKER) or rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"bad manifest path: {rel!r}")
    doc = {"step": step, "files": {k: files[k] for k in sorted(files)}}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def marker_for(manifest_bytes: bytes) -> bytes:
    return sha256_bytes(manifest_bytes).encode()


def total_bytes(manifest: dict[str, Any]) -> int:
    return sum(int(e["bytes"]) for e in manifest["files"].values())


def parse_manifest(manifest_bytes: bytes) -> dict[str, Any]:
    doc = json.loads(manifest_bytes)
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise ValueError("manifest has no files table")
    return doc


def check(
    step: int,
    manifest_bytes: bytes | None,
    marker_bytes: bytes | None,
    stat: Callable[[str], int | None],
    digest: Callable[[str], str] | None,
) -> tuple[bool, str]:
    """Verify one checkpoint from its manifest and marker.

    `stat(rel)` returns a file's size or None when it is missing; `digest(rel)`
    its sha256 (pass None to check sizes only, e.g. a cheap listing pass).
    Returns (ok, reason); the reason names the first problem found.
    """
    if marker_bytes is None:
        return False, f"step-{step} has no {MARKER} marker (unfinished save)"
    if manifest_bytes is None:
        return False, f"step-{step} has a marker but no {MANIFEST}"
    if marker_bytes.strip() != marker_for(manifest_bytes):
        return False, f"step-{step}: {MANIFEST} does not match the checksum in {MARKER}"
    try:
        doc = parse_manifest(manifest_bytes)
    except ValueError as exc:
        return False, f"step-{step}: unreadable {MANIFEST}: {exc}"
    if doc.get("step") != step:
        return False, f"step-{step}: manifest is for step {doc.get('step')}"
    for rel, entry in sorted(doc["files"].items()):
        size = stat(rel)
        if size is None:
            return False, f"step-{step}: {rel} is missing"
        if size != entry["bytes"]:
            return False, f"step-{step}: {rel} has {size} bytes, manifest says {entry['bytes']}"
        if digest is not None and digest(rel) != entry["sha256"]:
            return False, f"step-{step}: {rel} does not match its sha256"
    return True, "ok"
