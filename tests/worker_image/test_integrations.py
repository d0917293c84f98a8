"""The framework callbacks (regatta.integrations) in the examples that use
them, examples/hf_trainer.py and examples/lightning_train.py, and the Hugging
Face callback under TRL's SFTTrainer (programs/trl_sft.py), under real
torchrun ranks (gloo): alone, on SIGTERM, and against a real HTTP server
standing in for the control plane. No mocks: the real Trainer, the real SDK."""

import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from regatta.storage import open_storage

from tests.support.waiting import eventually

from .helpers import FRAMEWORKS_STANDBY, free_port, kill_tree, start_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FRAMEWORKS = {"hf": EXAMPLES / "hf_trainer.py", "lightning": EXAMPLES / "lightning_train.py",
              "trl": Path(__file__).parent / "programs" / "trl_sft.py"}
# Found, not imported: the ranks import them, the test process needs none.
if not all(importlib.util.find_spec(m)
           for m in ("transformers", "accelerate", "lightning", "trl", "datasets")):
    # The test extra pins them (`make install`): missing is a broken set-up,
    # not a reason to pass quietly.
    pytest.fail("transformers, accelerate, lightning, trl or datasets is missing: "
                "run `make install`", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def frameworks_standby():
    """The launches go through a standby that imported the frameworks
    (helpers.FRAMEWORKS_STANDBY), started ahead of the first and stopped
    with this file: their ranks are forked with transformers, Lightning and
    TRL imported, as a local cluster's `standby_imports` has them."""
    FRAMEWORKS_STANDBY.start()
    try:
        yield FRAMEWORKS_STANDBY
    finally:
        FRAMEWORKS_STANDBY.stop()


class Job:
    """One torchrun launch of an example with 2 ranks."""

    def __init__(self, tmp_path, framework, name, ckpt, *, steps, sleep=0.0, every=4, env=None):
        self.folder = tmp_path / name
        self.status = self.folder / "status"
        self.out = self.folder / "stdout.log"
        self.proc = start_torchrun(
            ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--monitor-interval=0.2",
             str(FRAMEWORKS[framework])],
            {"REGATTA_CONFIG": json.dumps({"steps": steps, "sleep": sleep}),
             "REGATTA_CHECKPOINT_URI": str(ckpt), "REGATTA_CHECKPOINT_EVERY": str(every),
             "REGATTA_STATUS_DIR": str(self.status), **(env or {})},
            self.folder, standby=FRAMEWORKS_STANDBY)

    def wait(self, timeout=90) -> "Job":
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            raise AssertionError(f"timed out:\n{self.log()[-3000:]}") from None
        return self

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def exit_codes(self) -> dict[int, int]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())["exit_code"]
                for p in self.status.glob("rank-*.json")}


def saved_step(framework: str, step_dir: Path) -> int:
    """The step the framework itself recorded in the committed checkpoint."""
    if framework in ("hf", "trl"):  # an SFTTrainer is a Trainer
        return json.loads((step_dir / "trainer_state.json").read_text())["global_step"]
    import torch

    return torch.load(step_dir / "lightning.ckpt", weights_only=False)["global_step"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_it_commits_verified_checkpoints_and_reports_them_and_its_metrics(
        tmp_path, framework, control_plane):
    ckpt = tmp_path / "ckpt"
    job = Job(tmp_path, framework, "reported", ckpt, steps=8,
              env=control_plane.env(attempt=5)).wait()

    assert job.proc.returncode == 0, job.log()[-3000:]
    assert job.exit_codes() == {0: 0, 1: 0}
    store = open_storage(str(ckpt))
    assert store.committed_steps() == [4, 8]  # REGATTA_CHECKPOINT_EVERY, and the last step
    for step in (4, 8):
        assert store.verify(step, deep=True) == (True, "ok")
        assert saved_step(framework, ckpt / f"step-{step}") == step
    files = set(store.read_manifest(8)["files"])
    if framework in ("hf", "trl"):  # the Trainer's folder whole, each rank's RNG state included
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json",
                "rng_state_0.pth", "rng_state_1.pth"} <= files
    else:
        assert "lightning.ckpt" in files
    reports = [r["body"] for r in control_plane.of_kind("checkpoints")]
    assert [c["step"] for c in reports] == [4, 8]
    assert all(c["manifest_sha256"] == store.manifest_sha256(c["step"]) for c in reports)
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    assert sorted({p["step"] for p in points if p["name"] == "loss"}) == list(range(1, 9))
    assert {p["rank"] for p in points} == {0}
    assert all(isinstance(p["value"], float) for p in points)
    events = [r["body"] for r in control_plane.of_kind("events")]
    assert [e["kind"] for e in events] == ["started", "finished"]
    assert events[-1]["data"] == {"step": 8}
    beats = [r["body"] for r in control_plane.of_kind("heartbeat")]
    assert {b["rank"] for b in beats} == {0, 1}


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_sigterm_gives_an_emergency_checkpoint_exit_83_and_a_rerun_resumes_from_it(
        tmp_path, framework, control_plane):
    ckpt = tmp_path / "ckpt"
    store = open_storage(str(ckpt))
    job = Job(tmp_path, framework, "drained", ckpt, steps=5000, sleep=0.05, every=3)
    try:
        eventually(lambda: store.is_committed(3) or job.proc.poll() is not None, timeout=60,
                   interval=0.05, what="step 3 committed")
    finally:  # whether the run ended or hung, its log says why
        assert store.is_committed(3), job.log()[-3000:]
    job.proc.send_signal(signal.SIGTERM)  # a drain: torchrun passes it to every rank
    job.wait()

    assert job.exit_codes() == {0: 83, 1: 83}, job.log()[-3000:]
    stopped = store.committed_steps()[-1]
    assert stopped > 3  # the emergency save, past the periodic one
    assert store.verify(stopped, deep=True) == (True, "ok")
    assert saved_step(framework, ckpt / f"step-{stopped}") == stopped
    status = json.loads((job.status / "rank-0.json").read_text())
    assert status["failure_class"] == "preempted" and status["step"] == stopped

    rerun = Job(tmp_path, framework, "rerun", ckpt, steps=stopped + 2, every=0,
                env=control_plane.env()).wait()

    assert rerun.proc.returncode == 0, rerun.log()[-3000:]
    resumed = [r["body"]["data"]["step"] for r in control_plane.of_kind("events")
               if r["body"]["kind"] == "resumed"]
    assert resumed == [stopped]  # the newest verified checkpoint
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    assert sorted({p["step"] for p in points if p["name"] == "loss"}) \
        == [stopped + 1, stopped + 2]  # not redone from the start
    assert [r["body"]["step"] for r in control_plane.of_kind("checkpoints")] == [stopped + 2]
    assert store.committed_steps()[-1] == stopped + 2
    assert saved_step(framework, ckpt / f"step-{stopped + 2}") == stopped + 2


def test_an_sft_run_resumes_from_the_checkpoint_the_control_plane_chose(
        tmp_path, control_plane):
    """Not the newest: a relaunch is told which verified checkpoint to load
    (REGATTA_RESUME_URI), and the SFTTrainer goes on from that one."""
    ckpt = tmp_path / "ckpt"
    first = Job(tmp_path, "trl", "first", ckpt, steps=8).wait()
    assert first.proc.returncode == 0, first.log()[-3000:]
    store = open_storage(str(ckpt))
    assert store.committed_steps() == [4, 8]

    rerun = Job(tmp_path, "trl", "rerun", ckpt, steps=10, every=0,
                env={**control_plane.env(), "REGATTA_RESUME_URI": str(ckpt / "step-4")}).wait()

    assert rerun.proc.returncode == 0, rerun.log()[-3000:]
    resumed = [r["body"]["data"]["step"] for r in control_plane.of_kind("events")
               if r["body"]["kind"] == "resumed"]
    assert resumed == [4]
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    assert sorted({p["step"] for p in points if p["name"] == "loss"}) == list(range(5, 11))
    assert store.verify(10, deep=True) == (True, "ok")
    assert saved_step("trl", ckpt / "step-10") == 10


def test_importing_regatta_needs_no_framework(tmp_path):
    probe = ("import sys; sys.modules['transformers'] = None; sys.modules['lightning'] = None\n"
             "sys.modules['pytorch_lightning'] = None\n"
             "import regatta, regatta.integrations, regatta.storage\n"
             "try:\n    import regatta.integrations.huggingface\n"
             "except ImportError:\n    print('needs transformers')\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["needs", "transformers"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_a_checkpoint_request_then_a_stop_directive_save_and_exit_83(
        tmp_path, framework, control_plane):
    control_plane.directives.update(checkpoint_request="req-7")

    def stop_after_the_requested_checkpoint(record):
        if record["kind"] == "checkpoints" and record["body"]["request_id"] == "req-7":
            control_plane.directives["stop"] = True

    control_plane.on_request = stop_after_the_requested_checkpoint
    ckpt = tmp_path / "ckpt"
    job = Job(tmp_path, framework, "directed", ckpt, steps=5000, sleep=0.05, every=0,
              env=control_plane.env()).wait()

    assert job.exit_codes() == {0: 83, 1: 83}, job.log()[-3000:]
    reports = [r["body"] for r in control_plane.of_kind("checkpoints")]
    requested = [r for r in reports if r["request_id"] == "req-7"]
    assert len(requested) == 1  # served once although the directive stays up
    (emergency,) = [r for r in reports if r["emergency"]]
    assert emergency["step"] > requested[0]["step"]
    store = open_storage(str(ckpt))
    for report in (requested[0], emergency):
        assert store.verify(report["step"], deep=True) == (True, "ok")
        assert report["manifest_sha256"] == store.manifest_sha256(report["step"])
        assert saved_step(framework, ckpt / f"step-{report['step']}") == report["step"]
    kinds = [r["body"]["kind"] for r in control_plane.of_kind("events")]
    assert kinds[-1] == "emergency_checkpoint" and "finished" not in kinds
