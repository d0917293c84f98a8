"""Exit codes: SIGTERM (83), user-code error (1), lost peer (84), bad config (85)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from regatta.storage import open_storage

from tests.support.waiting import eventually

from .helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_sigterm_leaves_a_committed_checkpoint_and_exit_code_83(cold_launcher, tmp_path,
                                                                 control_plane):
    ckpt = tmp_path / "ckpt"
    run = cold_launcher.start({"max_steps": 5000, "checkpoint_every_steps": 7,
                               "step_sleep_s": 0.02}, ckpt, env=control_plane.env())
    run.wait_for(lambda: "step 10 loss" in run.log(), what="step 10")
    # What a node drain or spot notice does on Kubernetes and Slurm: SIGTERM
    # to torchrun (a process of its own there), which forwards it to every rank.
    run.proc.send_signal(signal.SIGTERM)
    run.wait(60)

    assert run.exit_codes() == {0: 83, 1: 83}, run.log()[-3000:]
    statuses = run.statuses()
    assert {s["failure_class"] for s in statuses.values()} == {"preempted"}
    step = statuses[0]["step"]
    store = open_storage(str(ckpt))
    assert store.committed_steps()[-1] == step
    assert store.verify(step) == (True, "ok")
    emergency = [r["body"] for r in control_plane.of_kind("checkpoints") if r["body"]["emergency"]]
    assert [e["step"] for e in emergency] == [step]


def test_an_error_in_training_code_exits_1_and_reports_crashed(launcher, tmp_path,
                                                              control_plane):
    run = launcher.run({"max_steps": 20, "fail_at_step": 5}, tmp_path / "ckpt",
                       env=control_plane.env())

    assert run.exit_codes() == {0: 1, 1: 1}, run.log()[-3000:]
    assert run.statuses()[0]["step"] == 4
    assert "InjectedFailure: fail_at_step=5" in run.log()
    crashed = [r["body"] for r in control_plane.of_kind("events")
               if r["body"]["kind"] == "crashed"]
    assert {c["rank"] for c in crashed} == {0, 1}
    assert crashed[0]["data"]["failure_class"] == "code"
    assert crashed[0]["data"]["error_type"] == "InjectedFailure"
    assert "Traceback" in crashed[0]["data"]["traceback"]


def test_a_lost_peer_exits_84_on_the_survivor(launcher, tmp_path):
    run = launcher.start({"max_steps": 5000, "step_sleep_s": 0.02}, tmp_path / "ckpt")
    run.wait_for(lambda: "step 4 loss" in run.log(), what="step 4")
    rank_pids = sorted(run.ranks())
    os.kill(rank_pids[-1], signal.SIGKILL)
    run.wait(60)

    codes = run.exit_codes()
    assert list(codes.values()) == [84], run.log()[-3000:]
    assert next(iter(run.statuses().values()))["failure_class"] == "transient"


def test_a_rejected_config_exits_85_and_names_the_keys(tmp_path):
    env = {**os.environ, "REGATTA_CONFIG": json.dumps({"modle": "tiny", "n_head": 3}),
           "REGATTA_STATUS_DIR": str(tmp_path), "RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "trainer"], env=env, capture_output=True,
                          text=True, timeout=60)

    assert proc.returncode == 85
    assert "unknown config keys: modle" in proc.stderr
    status = json.loads((tmp_path / "rank-0.json").read_text())
    assert status["exit_code"] == 85 and status["failure_class"] == "code"


def _lone_rank(env_extra: dict, tmp_path) -> subprocess.Popen:
    """Rank 0 of a 2-rank gang whose rank 1 never comes: it waits in rendezvous."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
    env.update({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "REGATTA_STATUS_DIR": str(tmp_path / "status"),
                "REGATTA_CHECKPOINT_URI": str(tmp_path / "ckpt"), "OMP_NUM_THREADS": "1",
                **env_extra})
    return subprocess.Popen([sys.executable, "-m", "trainer"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def listening(port: int) -> bool:
    """Whether a socket listens on `port` of this machine (read from /proc,
    without connecting to it)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":  # LISTEN
                return True
    return False


def test_a_config_the_corpus_cannot_feed_exits_85_before_rendezvous(tmp_path):
    proc = _lone_rank({"REGATTA_CONFIG": json.dumps(
        {"model": "nano", "block_size": 200_000, "batch_size": 1, "val_every_steps": 5})},
        tmp_path)
    out, _ = proc.communicate(timeout=60)  # no peer: reaching rendezvous would hang

    assert proc.returncode == 85, out
    assert "block_size=200000 leaves the" in out and "joining the process group" not in out
    status = json.loads((tmp_path / "status" / "rank-0.json").read_text())
    assert status["exit_code"] == 85 and "block_size=200000" in status["error"]


def test_sigterm_during_rendezvous_exits_83_with_a_status_and_a_report(tmp_path,
                                                                      control_plane):
    port = free_port()
    proc = _lone_rank({"REGATTA_CONFIG": json.dumps({"model": "nano"}), "MASTER_PORT": str(port),
                       **control_plane.env(attempt=9)}, tmp_path)
    log = []
    for line in proc.stdout:
        log.append(line)
        if "joining the process group" in line:
            break
    # Once rank 0's TCPStore listens, its main thread is inside the store's
    # constructor (C++), waiting for rank 1, where a plain Python signal
    # handler would not run until a peer came.
    eventually(lambda: listening(port), timeout=60, what="rank 0's store listening")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)

    assert proc.returncode == 83, "".join(log) + out
    status = json.loads((tmp_path / "status" / "rank-0.json").read_text())
    assert status["failure_class"] == "preempted" and status["step"] == 0
    assert "during rendezvous" in status["error"]
    assert status["job_id"] == "3" and status["attempt_id"] == "9"
    (event,) = [r["body"] for r in control_plane.of_kind("events")]
    assert event["kind"] == "preempted" and event["job_id"] == "3"
    assert event["data"] == {"phase": "rendezvous", "step": 0, "checkpoint": False}
    assert not (tmp_path / "ckpt").exists()
