"""Each rank leaves its start-up phases in REGATTA_STATUS_DIR/startup-<RANK>.json
(regatta/startup.py), which the node's launcher reads when an attempt shows
nothing: the built-in trainer's phases in order, up to its first step."""

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_the_trainer_marks_each_start_up_phase_up_to_its_first_step(cold_launcher, tmp_path):
    """A cold start: a warm one's ranks mark "started" first (the standby's)."""
    run = cold_launcher.run({"max_steps": 3}, tmp_path / "ckpt", nproc=1)
    assert run.exit_codes() == {0: 0}, run.log()[-3000:]

    marker = json.loads((run.status_dir / "startup-0.json").read_text())

    assert [phase for phase, _ in marker["history"]] == [
        "config", "rendezvous", "setup", "resume", "training", "stepping"]
    assert (marker["phase"], marker["step"], marker["rank"]) == ("stepping", 1, 0)
    times = [at for _, at in marker["history"]]
    assert times == sorted(times)


def test_a_compiled_trainer_marks_its_first_step_as_compiling(launcher, tmp_path):
    run = launcher.run({"max_steps": 3, "compile": True}, tmp_path / "ckpt", nproc=1,
                       timeout=170)
    assert run.exit_codes() == {0: 0}, run.log()[-3000:]

    marker = json.loads((run.status_dir / "startup-0.json").read_text())

    assert [phase for phase, _ in marker["history"]][-3:] == ["training", "compiling",
                                                              "stepping"]
