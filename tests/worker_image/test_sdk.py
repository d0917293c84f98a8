"""The `regatta` SDK in a user's program (tests/worker_image/programs/
sdk_program.py) under real torchrun ranks (gloo), alone and against a real
HTTP server standing in for the control plane."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from regatta.storage import open_storage

from tests.support.waiting import eventually

from .helpers import flat_tensors, free_port, load_checkpoint, ranks_of, start_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "sdk_program.py")


class Program:
    def __init__(self, tmp_path, name, ckpt, *, env=None, steps=12, sleep=0.0, mode="dcp",
                 every=3):
        folder = tmp_path / name
        self.status = folder / "status"
        self.out = folder / "stdout.log"
        self.proc = start_torchrun(
            ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--monitor-interval=0.2", PROGRAM],
            {"SDK_STEPS": str(steps), "SDK_SLEEP": str(sleep), "SDK_MODE": mode,
             "REGATTA_CHECKPOINT_URI": str(ckpt), "REGATTA_CHECKPOINT_EVERY": str(every),
             "REGATTA_STATUS_DIR": str(self.status), **(env or {})},
            folder)

    def wait(self, timeout=120) -> "Program":
        self.proc.wait(timeout=timeout)
        return self

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def exit_codes(self) -> dict[int, int]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())["exit_code"]
                for p in self.status.glob("rank-*.json")}

    def lines(self, rank: int, word: str) -> list[int]:
        return [int(line.split()[3]) for line in self.log().splitlines()
                if line.startswith(f"rank {rank} step ") and line.endswith(word)]


def test_alone_it_saves_and_resumes_bitwise_identically_after_sigkill(tmp_path):
    reference = Program(tmp_path, "reference", tmp_path / "ref").wait()
    assert reference.proc.returncode == 0, reference.log()[-3000:]
    ckpt = tmp_path / "ckpt"
    store = open_storage(str(ckpt))
    killed = Program(tmp_path, "killed", ckpt, sleep=0.3)
    eventually(lambda: store.is_committed(6), timeout=90, interval=0.1, what="step 6 committed")
    os.kill(max(ranks_of(killed.proc)), signal.SIGKILL)
    killed.wait()
    assert store.committed_steps()[-1] < 12

    resumed = Program(tmp_path, "resumed", ckpt).wait()

    assert resumed.proc.returncode == 0, resumed.log()[-3000:]
    assert resumed.exit_codes() == {0: 0, 1: 0}
    assert resumed.lines(0, "save") == resumed.lines(1, "save") == [9]  # from step 6 on
    a = flat_tensors(load_checkpoint(tmp_path / "ref" / "step-12", tmp_path / "a.pt"))
    b = flat_tensors(load_checkpoint(ckpt / "step-12", tmp_path / "b.pt"))
    assert a.keys() == b.keys() and any(k.startswith("optim.") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    # Standalone retention kept every step (keep_last=100), each one verified.
    assert all(store.verify(s) == (True, "ok") for s in store.committed_steps())


def test_a_survivor_hands_over_the_last_step_with_no_code_of_the_programs_own(
        tmp_path, control_plane):
    """A program that saves `ModelState` with no per-rank state: when a peer
    dies, the survivor's uncaught collective error writes the last step it
    completed (not the step-6 checkpoint), and a run resumed from it ends
    bitwise equal to one never interrupted."""
    reference = Program(tmp_path, "reference", tmp_path / "ref", mode="stateless", every=6).wait()
    assert reference.proc.returncode == 0, reference.log()[-3000:]
    ckpt = tmp_path / "ckpt"
    store = open_storage(str(ckpt))
    killed = Program(tmp_path, "killed", ckpt, sleep=0.3, mode="stateless", every=6,
                     env=control_plane.env())
    eventually(lambda: store.is_committed(6), timeout=90, interval=0.1, what="step 6 committed")
    eventually(lambda: any(p["step"] >= 8 for r in control_plane.of_kind("metrics")
                           for p in r["body"]["points"]), timeout=30, what="step 8")
    os.kill(max(ranks_of(killed.proc)), signal.SIGKILL)
    killed.wait()

    handed = store.committed_steps()[-1]
    assert 8 <= handed < 12, (store.committed_steps(), killed.log()[-3000:])
    assert store.verify(handed) == (True, "ok")
    assert killed.exit_codes() == {0: 84}  # the killed rank wrote none
    events = {r["body"]["kind"]: r["body"] for r in control_plane.of_kind("events")}
    assert events["survivor_handover"]["data"]["step"] == handed
    assert "survivor_handover_failed" not in events

    resumed = Program(tmp_path, "resumed", ckpt, mode="stateless", every=6).wait()

    assert resumed.proc.returncode == 0, resumed.log()[-3000:]
    a = flat_tensors(load_checkpoint(tmp_path / "ref" / "step-12", tmp_path / "a.pt"))
    b = flat_tensors(load_checkpoint(ckpt / "step-12", tmp_path / "b.pt"))
    assert a.keys() == b.keys() and any(k.startswith("optim.") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_the_final_checkpoint_carries_the_exported_model_in_its_manifest(tmp_path):
    run = Program(tmp_path, "export", tmp_path / "ckpt", steps=6).wait()

    assert run.proc.returncode == 0, run.log()[-3000:]
    store = open_storage(str(tmp_path / "ckpt"))
    files = store.read_manifest(6)["files"]
    assert {"export/model.pt", "export/config.json", "config.json", ".metadata"} <= set(files)
    assert "export/model.pt" not in store.read_manifest(3)["files"]  # only the final one
    weights = torch.load(tmp_path / "ckpt" / "step-6" / "export" / "model.pt")
    assert set(weights) == {"0.weight", "0.bias", "2.weight", "2.bias"}  # no "module."
    dcp_state = flat_tensors(load_checkpoint(tmp_path / "ckpt" / "step-6", tmp_path / "w.pt"))
    assert torch.equal(weights["0.weight"], dcp_state["model.0.weight"])
    config = json.loads((tmp_path / "ckpt" / "step-6" / "export" / "config.json").read_text())
    assert config == {"layers": [16, 32, 1]}


def test_finish_frees_the_sdks_own_groups_and_leaves_the_programs_group_working(tmp_path):
    """A gloo group alive at interpreter teardown can abort a run that
    succeeded (SIGABRT, "terminate called without an active exception"):
    its thread frees the tensors of the last collective and needs the GIL.
    So `finish` frees the SDK's two groups, joining their threads then."""
    run = Program(tmp_path, "finish", tmp_path / "ckpt", steps=4).wait()

    assert run.proc.returncode == 0, run.log()[-3000:]
    lines = [line for line in run.log().splitlines() if " finished, gloo threads " in line]
    assert len(lines) == 2, run.log()[-3000:]
    for line in lines:
        before, after, total = map(int, re.findall(r"\d+", line.split("finished", 1)[1]))
        # Three groups' threads before (the program's, the SDK's two); the
        # program's alone after, and its collectives still go through.
        assert before > 0 and after == before // 3, line
        assert total == 2, line


def test_it_reports_heartbeats_metrics_checkpoints_and_events_in_the_protocols_shapes(
        tmp_path, control_plane):
    run = Program(tmp_path, "reported", tmp_path / "ckpt", steps=6, sleep=0.3,
                  env=control_plane.env(attempt=11)).wait()

    assert run.proc.returncode == 0, run.log()[-3000:]
    assert {r["auth"] for r in control_plane.requests} == {"Bearer rgw_test"}
    assert {r["path"].split("/attempts/")[1].split("/")[0] for r in control_plane.requests} \
        == {"11"}
    beats = [r["body"] for r in control_plane.of_kind("heartbeat")]
    assert {b["rank"] for b in beats} == {0, 1}
    assert all(b["node"] == "local-a-0" and b["job_id"] == "3" and "gpu" in b for b in beats)
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    losses = {(p["rank"], p["step"]) for p in points if p["name"] == "loss"}
    assert losses == {(r, s) for r in (0, 1) for s in range(1, 7)}  # tensors, sent as floats
    assert all(isinstance(p["value"], float) for p in points)
    assert all(r["body"]["batch_id"].startswith(("j3-a11-r0-", "j3-a11-r1-"))
               for r in control_plane.of_kind("metrics"))
    store = open_storage(str(tmp_path / "ckpt"))
    reports = [r["body"] for r in control_plane.of_kind("checkpoints")]
    assert [c["step"] for c in reports] == [3, 6]
    for c in reports:
        assert set(c) == {"step", "uri", "bytes", "manifest_sha256", "save_seconds",
                          "blocking_seconds", "emergency", "request_id", "job_id"}
        assert c["manifest_sha256"] == store.manifest_sha256(c["step"])
    events = [r["body"] for r in control_plane.of_kind("events")]
    assert [e["kind"] for e in events] == ["started", "finished"]
    assert events[-1]["data"] == {"step": 6}
    # Under a control plane the SDK deletes nothing: retention is the control plane's.
    assert store.committed_steps() == [3, 6]


def test_directives_reach_every_rank_at_the_same_step(tmp_path, control_plane):
    control_plane.directives.update(checkpoint_request="req-9", checkpoint_interval_steps=4)

    def stop_after_the_requested_checkpoint(record):
        if record["kind"] == "checkpoints" and record["body"]["request_id"] == "req-9":
            control_plane.directives["stop"] = True

    control_plane.on_request = stop_after_the_requested_checkpoint
    run = Program(tmp_path, "directed", tmp_path / "ckpt", steps=500, sleep=0.05, every=0,
                  env=control_plane.env()).wait()

    assert run.exit_codes() == {0: 83, 1: 83}, run.log()[-3000:]
    saves, stops = run.lines(0, "save"), run.lines(0, "stop")
    assert saves and saves == run.lines(1, "save")
    assert len(stops) == 1 and stops == run.lines(1, "stop")
    reports = [r["body"] for r in control_plane.of_kind("checkpoints")]
    requested = [r for r in reports if r["request_id"] == "req-9"]
    assert len(requested) == 1  # served once although the directive stays up
    assert all(s % 4 == 0 for s in saves if s != requested[0]["step"])  # the interval
    (emergency,) = [r for r in reports if r["emergency"]]
    assert emergency["step"] == stops[0]
    assert open_storage(str(tmp_path / "ckpt")).verify(stops[0]) == (True, "ok")
    kinds = [r["body"]["kind"] for r in control_plane.of_kind("events")]
    assert kinds[-1] == "emergency_checkpoint" and "finished" not in kinds


def test_files_a_program_wrote_are_committed_and_resumed_from(tmp_path):
    first = Program(tmp_path, "files", tmp_path / "ckpt", steps=6, mode="files").wait()
    assert first.proc.returncode == 0, first.log()[-3000:]
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.committed_steps() == [3, 6]
    assert {"rank-0.pt", "rank-1.pt", "config.json"} <= set(store.read_manifest(6)["files"])

    second = Program(tmp_path, "files-more", tmp_path / "ckpt", steps=9, mode="files").wait()

    assert second.proc.returncode == 0, second.log()[-3000:]
    assert second.lines(0, "save") == []  # steps 7 to 9 only: 3 and 6 were not redone
    assert store.committed_steps() == [3, 6, 9]


def test_the_torch_free_modules_import_where_torch_cannot(tmp_path):
    probe = ("import sys; sys.modules['torch'] = None\n"
             "import regatta, regatta.storage, regatta.manifest, regatta.reporting, "
             "regatta.launch, regatta.preemption, regatta.status, regatta.contract\n"
             "import trainer.config\n"
             "store = regatta.storage.open_storage(sys.argv[1])\n"
             "print(store.list_steps(), trainer.config.TrainerConfig().max_steps)\n"
             "try:\n    regatta.init\nexcept ImportError:\n    print('init needs torch')\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[] 100", "init needs torch"]


def test_sigterm_gives_an_emergency_checkpoint_on_every_rank_and_exit_83(tmp_path):
    ckpt = tmp_path / "ckpt"
    store = open_storage(str(ckpt))
    run = Program(tmp_path, "drained", ckpt, steps=5000, sleep=0.05)
    eventually(lambda: store.is_committed(3), timeout=90, interval=0.05, what="step 3 committed")
    run.proc.send_signal(signal.SIGTERM)  # a drain: torchrun passes it to every rank
    run.wait()

    assert run.exit_codes() == {0: 83, 1: 83}, run.log()[-3000:]
    stops = run.lines(0, "stop")
    assert len(stops) == 1 and stops == run.lines(1, "stop")
    assert store.committed_steps()[-1] == stops[0]
    assert store.verify(stops[0]) == (True, "ok")
    status = json.loads((run.status / "rank-0.json").read_text())
    assert status["failure_class"] == "preempted" and status["step"] == stops[0]


def test_a_step_redone_after_a_resume_from_an_older_one_is_committed_again(tmp_path):
    """step-6 no longer verifies, so the rerun resumes from step 3 and writes
    step 6 again into the folder that still holds step 6's old marker and
    manifest: the new files are committed, not the old marker listed as one
    of them (which crashed the save)."""
    first = Program(tmp_path, "files", tmp_path / "ckpt", steps=6, mode="files").wait()
    assert first.proc.returncode == 0, first.log()[-3000:]
    (tmp_path / "ckpt" / "step-6" / "rank-0.pt").write_bytes(b"torn")

    second = Program(tmp_path, "files-more", tmp_path / "ckpt", steps=9, mode="files").wait()

    assert second.proc.returncode == 0, second.log()[-3000:]
    assert second.lines(0, "save") == [6]
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.committed_steps() == [3, 6, 9]
    assert store.verify(6) == (True, "ok")
