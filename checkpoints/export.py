"""Export a job's final checkpoint as a ModelArtifact in the registry.

The control plane never imports torch: consolidating a model is the worker
image's work. The trainer (and any program through the SDK's `Export`)
writes the consolidated model into its final checkpoint, `step-N/export/`
(`model.pt`, a plain state_dict, and `config.json`), listed in the manifest
like every other file. The registry, a folder (settings.ARTIFACT_ROOT,
`<name>/v<version>/`), keeps a copy of those files; a checkpoint with no
`export/` folder (a program of the job's own that saved files of its own
kind) is kept whole instead. Every copy is checked against the manifest.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from regatta import manifest as mf

from .models import ModelArtifact

EXPORT_DIR = "export/"
MODEL_FILE = "model.pt"
CONFIG_FILE = "config.json"


class ExportError(RuntimeError):
    """The final checkpoint could not be exported; the message says why."""


def artifact_name(job) -> str:
    return f"{job.team.name}-{job.name}-{job.pk}".lower().replace(" ", "-")[:200]


def _sha256(path: Path) -> str:
    return mf.sha256_file(path)[0]


def exported_files(manifest: dict) -> tuple[str, dict[str, dict]]:
    """(format, {path in the artifact: manifest entry, with its source path})
    for a final checkpoint's manifest: its `export/` folder if it has one,
    else every file of the checkpoint."""
    files = manifest.get("files") or {}
    export = {rel[len(EXPORT_DIR):]: {**e, "source": rel}
              for rel, e in files.items() if rel.startswith(EXPORT_DIR)}
    if export:
        return ("torch" if MODEL_FILE in export else "files"), export
    whole = {rel: {**e, "source": rel} for rel, e in files.items()}
    return ("dcp" if ".metadata" in files else "files"), whole


def has_model(storage, step: int) -> bool:
    """Whether step-N carries the consolidated model (`export/model.pt`)."""
    return exported_files(storage.read_manifest(step) or {})[0] == "torch"


def export_final(job, checkpoint, storage, now) -> ModelArtifact:
    """Idempotent: the job's artifact is made once, whoever asks again.
    Raises ExportError (or a storage error) when it cannot be made."""
    existing = ModelArtifact.objects.filter(job=job, checkpoint=checkpoint).first()
    if existing is not None:
        return existing
    manifest = storage.read_manifest(checkpoint.step)
    if not manifest:
        raise ExportError(f"step-{checkpoint.step} has no manifest to export from")
    fmt, files = exported_files(manifest)
    # A rerun of a job that succeeded before exports a new version beside
    # the first run's, never in its place.
    name = artifact_name(job)
    version = ModelArtifact.objects.filter(job=job).count() + 1
    target = Path(settings.ARTIFACT_ROOT) / name / f"v{version}"
    _copy(storage, checkpoint.step, files, target)
    config = _config(target, files)
    listing = {rel: {"sha256": e["sha256"], "bytes": int(e["bytes"])} for rel, e in files.items()}
    primary = target / MODEL_FILE if fmt == "torch" else target
    sha = _sha256(primary) if primary.is_file() else mf.sha256_bytes(
        json.dumps(listing, sort_keys=True).encode())
    try:
        with transaction.atomic():
            return ModelArtifact.objects.create(
                job=job, checkpoint=checkpoint, name=name, version=version, uri=str(primary),
                bytes=sum(e["bytes"] for e in listing.values()), sha256=sha, format=fmt,
                config=config, files=listing, created_at=now,
            )
    except IntegrityError:
        return ModelArtifact.objects.get(name=name, version=version)


def _copy(storage, step: int, files: dict[str, dict], target: Path) -> None:
    """Each file from the checkpoint into `target`, checked against its
    manifest entry; a half-made copy is removed."""
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        for rel, entry in files.items():
            dest = staging / rel
            if ".." in Path(rel).parts:
                raise ExportError(f"refusing the path {rel!r} in step-{step}'s manifest")
            storage.download_file(f"step-{step}/{entry['source']}", dest)
            digest, size = mf.sha256_file(dest)
            if digest != entry["sha256"] or size != int(entry["bytes"]):
                raise ExportError(f"step-{step}/{entry['source']} does not match its manifest")
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _config(target: Path, files: dict[str, dict]) -> dict:
    if CONFIG_FILE not in files:
        return {}
    try:
        config = json.loads((target / CONFIG_FILE).read_text())
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}
