"""Who deletes checkpoints: the trainer alone keeps its last k; under a control
plane it deletes nothing and leaves pruning to the control plane's retention
(checkpoints/retention.py), which knows what is verified or pinned."""

import pytest
from regatta.storage import open_storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CONFIG = {"max_steps": 10, "checkpoint_every_steps": 2, "keep_last": 2}


def test_alone_it_keeps_its_last_k_checkpoints(launcher, tmp_path):
    run = launcher.run(CONFIG, tmp_path / "ckpt")

    assert run.proc.returncode == 0, run.log()[-3000:]
    assert open_storage(str(tmp_path / "ckpt")).list_steps() == [8, 10]


def test_under_a_control_plane_it_deletes_no_checkpoint(launcher, tmp_path, control_plane):
    run = launcher.run(CONFIG, tmp_path / "ckpt", env=control_plane.env())

    assert run.proc.returncode == 0, run.log()[-3000:]
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.committed_steps() == [2, 4, 6, 8, 10]
    reported = [r["body"]["step"] for r in control_plane.of_kind("checkpoints")]
    assert reported == [2, 4, 6, 8, 10]
