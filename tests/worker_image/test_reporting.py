"""Reports reach a real HTTP server; directives are obeyed; a slow server costs nothing."""

import re

import pytest
from regatta.storage import open_storage

from .helpers import ControlPlane

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_it_reports_heartbeats_metrics_checkpoints_and_events(launcher, tmp_path,
                                                              control_plane):
    ckpt = tmp_path / "ckpt"
    run = launcher.run({"max_steps": 12, "checkpoint_every_steps": 6, "step_sleep_s": 0.05,
                        "val_every_steps": 6, "val_batches": 1}, ckpt,
                       env=control_plane.env(attempt=7))

    assert run.proc.returncode == 0, run.log()[-3000:]
    assert {r["path"].split("/attempts/")[1].split("/")[0] for r in control_plane.requests} \
        == {"7"}
    assert {r["auth"] for r in control_plane.requests} == {"Bearer rgw_test"}
    # REGATTA_JOB_ID travels with every report, and names the metric batches.
    assert {r["body"]["job_id"] for r in control_plane.requests} == {"3"}
    assert all(r["body"]["batch_id"].startswith("j3-a7-r0-")
               for r in control_plane.of_kind("metrics"))
    beats = [r["body"] for r in control_plane.of_kind("heartbeat")]
    assert {b["rank"] for b in beats} == {0, 1}
    assert all(b["node"] == "local-a-0" and b["gpu"] is None for b in beats)
    assert max(b["step"] for b in beats) > 0
    points = [p for r in control_plane.of_kind("metrics") for p in r["body"]["points"]]
    names = {p["name"] for p in points}
    assert {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s",
            "step_time_s"} <= names
    assert "mfu" not in names  # no GPU, so no known peak
    assert {p["step"] for p in points if p["name"] == "loss"} == {2, 4, 6, 8, 10, 12}
    store = open_storage(str(ckpt))
    reports = {r["body"]["step"]: r["body"] for r in control_plane.of_kind("checkpoints")}
    assert sorted(reports) == [6, 12]
    for step, report in reports.items():
        assert report["uri"] == store.step_uri(step)
        assert report["manifest_sha256"] == store.manifest_sha256(step)
        assert report["bytes"] > 0 and report["save_seconds"] >= report["blocking_seconds"]
        assert report["emergency"] is False and report["request_id"] is None
    kinds = [r["body"]["kind"] for r in control_plane.of_kind("events")]
    assert kinds == ["started", "finished"]


def test_a_checkpoint_request_directive_produces_one_checkpoint(launcher, tmp_path,
                                                                control_plane):
    control_plane.directives["checkpoint_request"] = "req-1"

    def stop_after_the_requested_checkpoint(record):
        if record["kind"] == "checkpoints" and record["body"]["request_id"] == "req-1":
            control_plane.directives["stop"] = True

    control_plane.on_request = stop_after_the_requested_checkpoint
    ckpt = tmp_path / "ckpt"
    run = launcher.run({"max_steps": 2000, "step_sleep_s": 0.02}, ckpt,
                       env=control_plane.env())

    assert run.exit_codes() == {0: 83, 1: 83}, run.log()[-3000:]
    reports = [r["body"] for r in control_plane.of_kind("checkpoints")]
    requested = [r for r in reports if r["request_id"] == "req-1"]
    assert len(requested) == 1  # served once although the directive stays up
    emergency = [r for r in reports if r["emergency"]]
    assert len(emergency) == 1 and emergency[0]["step"] > requested[0]["step"]
    store = open_storage(str(ckpt))
    assert store.verify(requested[0]["step"]) == (True, "ok")
    assert store.verify(emergency[0]["step"]) == (True, "ok")
    kinds = [r["body"]["kind"] for r in control_plane.of_kind("events")]
    assert "emergency_checkpoint" in kinds and "finished" not in kinds


def test_a_checkpoint_interval_directive_changes_the_interval(launcher, tmp_path,
                                                              control_plane):
    control_plane.directives["checkpoint_interval_steps"] = 5
    run = launcher.run({"max_steps": 25, "checkpoint_every_steps": 0, "keep_last": 20,
                        "step_sleep_s": 0.05}, tmp_path / "ckpt", env=control_plane.env())

    assert run.proc.returncode == 0, run.log()[-3000:]
    steps = sorted(r["body"]["step"] for r in control_plane.of_kind("checkpoints"))
    assert steps[-1] == 25 and len(steps) >= 3
    assert all(s % 5 == 0 for s in steps)


def _training_seconds(log: str) -> float:
    """From the first step's log line to the last: excludes start-up and exit."""
    stamps = [re.match(r"\S+ (\d+):(\d+):([\d,]+)", line) for line in log.splitlines()
              if "[rank 0]" in line and " loss " in line and "val_loss" not in line]
    secs = [int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3].replace(",", ".")) for m in stamps]
    return secs[-1] - secs[0]


def test_training_runs_at_full_speed_while_the_control_plane_is_slow_or_down(
        launcher, tmp_path):
    config = {"max_steps": 40, "log_every_steps": 5, "heartbeat_interval_s": 0.1}
    baseline = launcher.run(config, tmp_path / "a")
    slow_plane = ControlPlane(delay_s=2.0)
    try:
        slow = launcher.run(config, tmp_path / "b", env=slow_plane.env())
    finally:
        slow_plane.close()
    down = launcher.run(config, tmp_path / "c",
                        env={**slow_plane.env(), "REGATTA_URL": "http://127.0.0.1:9"})

    for run in (baseline, slow, down):
        assert run.proc.returncode == 0, run.log()[-3000:]
    base_s = _training_seconds(baseline.log())
    # Generous: two shared cores and other test suites running beside this one.
    assert _training_seconds(slow.log()) < base_s * 1.5 + 1.0
    assert _training_seconds(down.log()) < base_s * 1.5 + 1.0
    assert slow_plane.of_kind("heartbeat")  # it did talk to the slow server
    # With the control plane down to the end, rank 0 (the one that logs and
    # sends the run's events) left what it could not deliver in the job's
    # storage, for the control plane to collect.
    left = {int(p.name.split("-")[1]): p.read_text()
            for p in (tmp_path / "c" / "reports" / "attempt-7").glob("rank-*.jsonl")}
    assert '"kind": "finished"' in left[0] and '"endpoint": "metrics"' in left[0]
