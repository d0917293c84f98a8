"""The built-in trainer's eval mode (an eval run's program, docs/evaluation.md)
on real gloo ranks: it loads the checkpoint it was asked for, reports held-out
val_loss, val_perplexity and samples at that step, and writes nothing; asked
for a step it cannot load, it fails rather than evaluate another."""

import math

import pytest
from regatta.storage import open_storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

EVAL = {"mode": "eval", "val_batches": 2, "eval_samples": 2, "eval_sample_tokens": 5}


@pytest.fixture(scope="module")
def trained(module_launcher, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("trained") / "ckpt"
    run = module_launcher.run({"max_steps": 10, "checkpoint_every_steps": 5}, ckpt)
    assert run.proc.returncode == 0, run.log()[-3000:]
    return ckpt


def test_it_reports_the_asked_step_s_held_out_loss_perplexity_and_samples(
        launcher, trained, control_plane):
    store = open_storage(str(trained))
    before = {step: store.read_manifest(step) for step in store.list_steps()}
    run = launcher.run(EVAL, trained, nproc=2, resume="5", env={
        **control_plane.env(), "REGATTA_RESUME_URI": str(trained / "step-5")})

    assert run.proc.returncode == 0, run.log()[-3000:]
    points = {(p["name"], p["step"]): p["value"] for r in control_plane.of_kind("metrics")
              for p in r["body"]["points"]}
    loss = points[("val_loss", 5)]
    assert 0 < loss < 6 and points[("val_perplexity", 5)] == pytest.approx(math.exp(loss))
    evaluated = [r["body"] for r in control_plane.of_kind("events")
                 if r["body"]["kind"] == "evaluated"]
    assert len(evaluated) == 1 and evaluated[0]["data"]["step"] == 5
    samples = evaluated[0]["data"]["samples"]
    assert len(samples) == 2 and all(s["prompt"] for s in samples)
    assert all(len(s["completion"].encode("utf-8", "surrogatepass")) >= 1 for s in samples)
    # Read-only: the checkpoints are as they were, and no new one appeared.
    assert {step: store.read_manifest(step) for step in store.list_steps()} == before


def test_it_refuses_to_evaluate_a_step_other_than_the_one_asked(launcher, trained):
    run = launcher.run(EVAL, trained, nproc=1, resume="7")
    assert run.proc.returncode != 0
    assert "asked to evaluate step 7, but loaded 5" in run.log()
