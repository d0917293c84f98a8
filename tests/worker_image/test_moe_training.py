"""The nano-moe preset on 2 gloo ranks: trains with DDP and FSDP, resumes
bitwise after a SIGKILL, and reports its expert load to the control plane."""

import pytest
from regatta.storage import open_storage

from .helpers import losses
from .test_resume import assert_same_state, kill_a_rank_after_step_8_is_committed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# A tight capacity, so some tokens are dropped and the drop path is exercised.
MOE = {"model": "nano-moe", "moe_capacity_factor": 1.0, "max_steps": 16,
       "checkpoint_every_steps": 4, "keep_last": 10, "dropout": 0.1, "grad_accum_steps": 2}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_moe_preset_resumes_bitwise_after_sigkill(launcher, tmp_path, strategy):
    config = {**MOE, "strategy": strategy}
    reference = tmp_path / "reference"
    run = launcher.run(config, reference)
    assert run.proc.returncode == 0, run.log()[-3000:]
    assert open_storage(str(reference)).list_steps() == [4, 8, 12, 16]
    curve = losses(run.log())
    assert len(curve) == 8 and curve[-1] < curve[0], curve

    ckpt = tmp_path / "ckpt"
    kill_a_rank_after_step_8_is_committed(launcher, config, ckpt)
    resumed = launcher.run(config, ckpt)

    assert resumed.proc.returncode == 0, resumed.log()[-3000:]
    assert "resumed from" in resumed.log()
    assert_same_state(reference / "step-16", ckpt / "step-16", tmp_path)


def test_the_expert_load_metrics_arrive(launcher, tmp_path, control_plane):
    run = launcher.run({"model": "nano-moe", "moe_capacity_factor": 1.0, "max_steps": 4},
                       tmp_path / "ckpt", env=control_plane.env())

    assert run.proc.returncode == 0, run.log()[-3000:]
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    by_step: dict[int, dict[str, float]] = {}
    for p in points:
        by_step.setdefault(p["step"], {})[p["name"]] = p["value"]
    assert sorted(by_step) == [2, 4]
    for values in by_step.values():
        for layer in (0, 1):
            loads = [values[f"moe/layer{layer}/expert{e}_load"] for e in range(8)]
            assert sum(loads) == pytest.approx(1.0)
            assert 0 < values[f"moe/layer{layer}/dropped"] < 1
            assert values[f"moe/layer{layer}/aux_loss"] >= 1.0 - 1e-6
        assert values["moe/aux_loss"] == pytest.approx(
            values["moe/layer0/aux_loss"] + values["moe/layer1/aux_loss"])
        assert "loss" in values and "grad_norm" in values
    assert all(p["rank"] == 0 for p in points)
