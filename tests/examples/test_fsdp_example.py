"""examples/train_fsdp_sdk.py under real torchrun ranks (gloo, no control
plane): sharded checkpoints, a rerun that resumes from the newest verified
one instead of redoing its steps, and the consolidated model exported whole."""

import os
import subprocess
from pathlib import Path

import pytest
import torch
from regatta.storage import open_storage

from tests.worker_image.helpers import TORCHRUN, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_fsdp_sdk.py"


def train(tmp_path, steps: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
    env.update(OMP_NUM_THREADS="1", REGATTA_CHECKPOINT_URI=str(tmp_path / "ckpt"),
               REGATTA_CHECKPOINT_EVERY="10")
    return subprocess.run(
        [TORCHRUN, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(SCRIPT), "--steps", str(steps)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=200)


def test_it_checkpoints_sharded_resumes_and_exports_the_whole_model(tmp_path):
    first = train(tmp_path, 20)
    assert first.returncode == 0, first.stderr[-3000:]
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.committed_steps() == [10, 20]
    shards = {p.name for p in (tmp_path / "ckpt" / "step-10").glob("*.distcp")}
    assert shards == {"__0_0.distcp", "__1_0.distcp"}  # each rank wrote its own

    second = train(tmp_path, 30)

    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 20" in second.stdout  # steps 1-20 were not redone
    assert store.committed_steps() == [10, 20, 30]
    assert store.verify(30) == (True, "ok")
    model = torch.load(tmp_path / "ckpt" / "step-30" / "export" / "model.pt", weights_only=True)
    assert model["blocks.0.ff.0.weight"].shape == (256, 64)  # gathered, not a shard
    assert model["head.weight"].shape == (1, 64)
