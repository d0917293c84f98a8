"""DDP and FSDP each train the built-in model on 2 gloo ranks, the loss falls, and
the final checkpoint exports the whole model."""

import pytest
import torch
from regatta.storage import open_storage

from .helpers import losses

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_loss_falls(launcher, tmp_path, strategy):
    run = launcher.run({"strategy": strategy, "max_steps": 40, "grad_accum_steps": 2,
                        "val_every_steps": 20, "val_batches": 2}, tmp_path / "ckpt")

    assert run.proc.returncode == 0, run.log()[-3000:]
    assert run.exit_codes() == {0: 0, 1: 0}
    curve = losses(run.log())
    assert len(curve) == 20
    assert sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 0.3, curve
    assert "val_loss" in run.log()
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.list_steps() == [40]
    assert store.verify(40) == (True, "ok")
    # The final checkpoint carries the whole model for the registry, gathered
    # from FSDP's shards too.
    assert {"export/model.pt", "export/config.json"} <= set(store.read_manifest(40)["files"])
    weights = torch.load(tmp_path / "ckpt" / "step-40" / "export" / "model.pt")
    assert weights["lm_head.weight"].shape == (256, 64) and "wte.weight" in weights
