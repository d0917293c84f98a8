"""The documented way to load the built-in model (docs/cli.md) works on what
the export and the download API hand out: the block is run as written."""

import json
import re
from pathlib import Path

import pytest
import torch
from django.utils import timezone
from regatta import manifest as mf
from trainer.config import TrainerConfig
from trainer.model import GPT, GPTShape

from checkpoints.export import export_final
from checkpoints.models import Checkpoint
from jobs.checkpointing import job_checkpoint_uri, open_job_storage
from tests.api_factories import make_job

pytestmark = pytest.mark.usefixtures("fleet_dirs")

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def documented_snippet() -> str:
    text = DOC.read_text()
    section = text.split("## Downloading the model a job exported", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def final_checkpoint_of_the_trainer(job, step, cfg: TrainerConfig) -> tuple[Checkpoint, GPT]:
    """The export the trainer writes into its final step (regatta.state.Export:
    the full state_dict and the config), with the manifest and marker."""
    torch.manual_seed(0)
    model = GPT(GPTShape(vocab_size=cfg.vocab_size, **cfg.arch()))
    root = Path(job_checkpoint_uri(job)) / f"step-{step}"
    (root / "export").mkdir(parents=True)
    torch.save(model.state_dict(), root / "export" / "model.pt")
    (root / "export" / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1,
                                                            sort_keys=True))
    rels = ["export/model.pt", "export/config.json"]
    manifest = mf.build_manifest(step, mf.hash_local_files(root, rels))
    (root / mf.MANIFEST).write_bytes(manifest)
    (root / mf.MARKER).write_bytes(mf.marker_for(manifest))
    checkpoint = Checkpoint.objects.create(job=job, step=step, uri=f"file://{root}",
                                           manifest_sha256=mf.sha256_bytes(manifest))
    return checkpoint, model


def test_the_documented_snippet_loads_the_downloaded_model(api, owner, team, cluster, tmp_path,
                                                          monkeypatch, capsys):
    job = make_job(team, cluster, owner, phase="succeeded")
    cfg = TrainerConfig.from_dict({"model": "nano", "max_steps": 20, "warmup_steps": 2})
    checkpoint, trained = final_checkpoint_of_the_trainer(job, 20, cfg)
    artifact = export_final(job, checkpoint, open_job_storage(job), timezone.now())
    assert artifact.format == "torch"

    folder = tmp_path / "gpt-model"
    folder.mkdir()
    client = api(owner)
    for f in client.get(f"/api/v1/artifacts/{artifact.pk}/files/").json()["files"]:
        resp = client.get(f"/api/v1/artifacts/{artifact.pk}/files/{f['path']}")
        (folder / f["path"]).write_bytes(b"".join(resp.streaming_content))

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(documented_snippet(), str(DOC), "exec"), namespace)  # noqa: S102

    loaded = namespace["model"].state_dict()
    assert loaded.keys() == trained.state_dict().keys()
    assert all(torch.equal(loaded[k], v) for k, v in trained.state_dict().items())
    assert capsys.readouterr().out.startswith("ROMEO:")
