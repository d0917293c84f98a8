"""Export a job's final checkpoint as a ModelArtifact in the registry.

The DCP folder (model and optimizer shards) is converted into one torch.save
file with `dcp_to_torch_save`, the model's weights are kept (the optimizer
state is not part of a released model), and the trainer's config.json goes
beside them. The registry is a folder, settings.ARTIFACT_ROOT:
`<name>/v<version>/model.pt` and `config.json`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from .models import ModelArtifact
from .storage import open_job_storage


def artifact_name(job) -> str:
    return f"{job.team.name}-{job.name}-{job.pk}".lower().replace(" ", "-")[:200]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def export_final(job, checkpoint, now) -> ModelArtifact:
    """Idempotent: the job's artifact is made once, whoever asks again."""
    existing = ModelArtifact.objects.filter(job=job, checkpoint=checkpoint).first()
    if existing is not None:
        return existing
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    name = artifact_name(job)
    version = 1
    target = Path(settings.ARTIFACT_ROOT) / name / f"v{version}"
    target.mkdir(parents=True, exist_ok=True)
    storage = open_job_storage(job)
    with tempfile.TemporaryDirectory(prefix="regatta-export-") as tmp:
        source = storage.local_dir(checkpoint.step)
        if source is None:
            source = storage.download_step(checkpoint.step, Path(tmp) / "step")
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(source), str(whole))
        state = torch.load(whole, weights_only=False, map_location="cpu")
        weights = state.get("model", state)
        torch.save(weights, target / "model.pt")
        config_file = Path(source) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
    (target / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    model_file = target / "model.pt"
    try:
        with transaction.atomic():
            return ModelArtifact.objects.create(
                job=job, checkpoint=checkpoint, name=name, version=version,
                uri=str(model_file), bytes=model_file.stat().st_size, sha256=_sha256(model_file),
                format="torch", config=config, created_at=now,
            )
    except IntegrityError:
        return ModelArtifact.objects.get(name=name, version=version)


def remove_files(artifact: ModelArtifact) -> None:
    shutil.rmtree(Path(artifact.uri).parent, ignore_errors=True)
