"""Every finished run leaves its model exported in its final checkpoint
(`step-N/export/`), whichever way that step was taken: a stop asked at the
last step, or a run resumed at the last step from a checkpoint without one."""

import json

import pytest
from regatta.storage import open_storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def exported(ckpt, step: int) -> list[str]:
    manifest = open_storage(str(ckpt)).read_manifest(step) or {}
    return sorted(rel for rel in manifest.get("files", {}) if rel.startswith("export/"))


def test_a_stop_asked_at_the_last_step_finishes_with_the_exported_model(
        launcher, tmp_path, control_plane):
    ckpt = tmp_path / "ckpt"
    # Asked to stop before the first step: a directive acts at the boundary
    # after the one it arrived at, so the stop lands on step 2, the last.
    control_plane.directives["stop"] = True
    run = launcher.run({"max_steps": 2, "warmup_steps": 1}, ckpt, env=control_plane.env())

    assert "asked to stop at the last step 2" in run.log(), run.log()[-3000:]
    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    assert open_storage(str(ckpt)).committed_steps() == [2]
    assert exported(ckpt, 2) == ["export/config.json", "export/model.pt"]
    kinds = [r["body"]["kind"] for r in control_plane.of_kind("events")]
    assert "finished" in kinds and "emergency_checkpoint" not in kinds


def test_a_run_resumed_at_its_last_step_exports_the_model_the_checkpoint_lacked(
        launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = launcher.run({"max_steps": 4, "warmup_steps": 1, "checkpoint_every_steps": 2,
                          "async_checkpoint": False}, ckpt)
    assert first.proc.returncode == 0, first.log()[-3000:]
    assert exported(ckpt, 2) == []  # a periodic checkpoint: no model export

    # Resumed at step 2 with 2 as its last step (as after an emergency
    # checkpoint at the last step): it finishes at once.
    again = launcher.run({"max_steps": 2, "warmup_steps": 1}, ckpt, resume="2")

    assert again.proc.returncode == 0, again.log()[-3000:]
    assert exported(ckpt, 2) == ["export/config.json", "export/model.pt"]
    assert open_storage(str(ckpt)).verify(2) == (True, "ok")
    config = json.loads(open_storage(str(ckpt)).read_bytes("step-2/export/config.json"))
    assert config["max_steps"] == 2
