"""The local provider runs attempts as real detached torchrun processes.

Every test here starts real torchrun gangs on this machine (gloo on CPU), so
they are marked slow and kept to a few steps.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from regatta.node import procs

from tests.support.local_fleet import alive, fleet, make_pool, progress, request, wait_done
from tests.support.waiting import eventually

__all__ = ["fleet"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NANO_TRAINER = {"model": "nano", "batch_size": 4, "max_steps": 4, "warmup_steps": 1,
                "log_every_steps": 2, "heartbeat_interval_s": 0.5}


def test_a_two_node_attempt_of_the_trainer_runs_to_exit_0(fleet, tmp_path):
    pool = make_pool()
    ckpt = tmp_path / "ckpt"
    req = request(fleet, pool, "job-1-a1", command=("-m", "trainer"),
                  env={"REGATTA_CONFIG": json.dumps(NANO_TRAINER),
                       "REGATTA_CHECKPOINT_URI": str(ckpt), "REGATTA_RESUME_STEP": "none"})
    ref = fleet.launch(req)
    assert fleet.launch(req) == ref, "a second launch of the same attempt starts nothing new"
    assert [n["node"] for n in ref["nodes"]] == ["lab-a-0", "lab-a-1"]
    assert ref["master_port"] > 0

    status = wait_done(fleet, ref)

    assert status.state == "succeeded", status.message + "\n" + status.nodes[0].log_tail
    assert [(n.node, n.running, n.exit_code, n.signal) for n in status.nodes] == [
        ("lab-a-0", False, 0, None), ("lab-a-1", False, 0, None)]
    assert [[(r["rank"], r["exit_code"]) for r in n.ranks] for n in status.nodes] == [
        [(0, 0)], [(1, 0)]]
    assert (ckpt / "step-4" / "COMMITTED").exists()
    # Each node's trainer knew which logical node it ran on.
    assert len(list((Path(ref["dir"])).glob("node-*/launcher.json"))) == 2


def test_an_attempt_outlives_the_process_that_launched_it(fleet):
    pool = make_pool()
    req = request(fleet, pool, "job-2-a1", env={"REGATTA_TEST_STEPS": "20"})
    script = (
        "import json, sys; from pathlib import Path;"
        "from clusters.providers.local import LocalProvider;"
        "from tests.support.local_fleet import make_pool, request;"
        f"p = LocalProvider('lab', Path({str(fleet.root)!r}));"
        "req = request(p, make_pool(), 'job-2-a1', env={'REGATTA_TEST_STEPS': '20'});"
        "print(json.dumps(p.launch(req)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[4])
    assert done.returncode == 0, done.stderr
    ref = json.loads(done.stdout)

    assert fleet.observe(ref).state == "running"
    assert fleet.launch(req) == ref, "a restarted worker finds the attempt, not a new one"
    status = wait_done(fleet, ref)
    assert status.state == "succeeded", status.message
    assert [r["step"] for n in status.nodes for r in n.ranks] == [20, 20]


def test_a_rank_that_fails_fails_the_attempt_with_its_exit_code(fleet):
    ref = fleet.launch(request(fleet, make_pool(), "job-3-a1", env={"REGATTA_TEST_EXIT": "1"}))

    status = eventually(lambda: not any((s := fleet.observe(ref)).nodes[i].running
                                        for i in (0, 1)) and s,
                        timeout=60, what="both nodes to end")

    assert status.state == "failed"
    assert {n.exit_code for n in status.nodes} == {1}
    assert all(n.signal is None for n in status.nodes)
    assert "exit code 1" in status.message
    exit_record = json.loads((Path(ref["dir"]) / "node-0" / "exit.json").read_text())
    assert exit_record["torchrun_returncode"] == 1 and exit_record["exit_code"] == 1


def test_a_killed_node_is_reported_failed_by_signal_9(fleet):
    pool = make_pool()
    ref = fleet.launch(request(fleet, pool, "job-4-a1",
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1"}))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=60, what="the gang to start stepping")

    evidence = fleet.inject_fault(pool, "lab-a-1", "kill")

    assert evidence["fault"] == "kill" and evidence["pids"]
    assert ref["nodes"][1]["pid"] in evidence["pids"]
    assert not any(alive(pid) for pid in evidence["pids"])
    status = fleet.observe(ref)
    assert status.state == "failed"
    killed = status.nodes[1]
    assert (killed.node, killed.running, killed.signal) == ("lab-a-1", False, 9)
    assert [n.node for n in status.failed_nodes] == ["lab-a-1"]
    assert "signal 9" in status.message
    nodes = {n.name: n for n in fleet.list_nodes(pool)}
    assert nodes["lab-a-1"].ready is False and nodes["lab-a-0"].ready is True
    fleet.stop(ref, grace_s=2)
    assert procs.scan(attempt_dir=ref["dir"]) == []


def test_killing_one_rank_fails_its_node_by_that_signal(fleet):
    ref = fleet.launch(request(fleet, make_pool(), "job-5-a1", nproc=2,
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1"}))
    eventually(lambda: progress(ref, 3, 1) >= 1, timeout=60, what="the gang to start stepping")

    pid = fleet.kill_rank(ref, 3)

    status = eventually(lambda: (s := fleet.observe(ref)).state == "failed"
                        and not s.nodes[1].running and s, timeout=30, what="the attempt to fail")
    eventually(lambda: not alive(pid), timeout=10, what="the rank to die")
    node = next(n for n in status.failed_nodes if n.node_rank == 1)
    assert node.signal == 9 and node.exit_code is None
    fleet.stop(ref, grace_s=2)
    assert procs.scan(attempt_dir=ref["dir"]) == []


def test_a_hung_node_stops_stepping_and_stop_cleans_it_up(fleet):
    pool = make_pool()
    ref = fleet.launch(request(fleet, pool, "job-6-a1",
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1"}))
    eventually(lambda: progress(ref, 0, 0) >= 1, timeout=60, what="the gang to start stepping")

    evidence = fleet.inject_fault(pool, "lab-a-0", "hang")

    assert evidence["fault"] == "hang" and len(evidence["pids"]) == 1
    rank_pid = evidence["pids"][0]
    assert procs.stat(rank_pid)[1] == "T"
    before = progress(ref, 1, 1)
    # Not a wait: time passing without progress is what the test shows.
    time.sleep(1.5)  # ~15 steps' worth, had anything kept going
    assert progress(ref, 1, 1) <= before + 1, "the healthy node waits in the collective"
    assert procs.stat(rank_pid)[1] == "T"
    assert fleet.observe(ref).state == "running", "a hang looks alive to the provider"

    everyone = procs.scan(attempt_dir=ref["dir"])
    fleet.stop(ref, grace_s=3)

    assert procs.scan(attempt_dir=ref["dir"]) == []
    for proc in everyone:
        assert not alive(proc.pid)
    assert fleet.observe(ref).state == "failed"


def test_stop_leaves_no_process_behind_and_is_idempotent(fleet):
    ref = fleet.launch(request(fleet, make_pool(), "job-7-a1",
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1"}))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=60, what="the gang to start stepping")
    everyone = procs.scan(attempt_dir=ref["dir"])
    assert len([p for p in everyone if p.rank is not None]) == 2

    fleet.stop(ref, grace_s=10)
    fleet.stop(ref, grace_s=10)

    for proc in everyone:
        assert not alive(proc.pid)
        if procs.stat(proc.pid) is None:  # reaped; a zombie still answers kill(0)
            with pytest.raises(ProcessLookupError):
                os.kill(proc.pid, 0)
    status = fleet.observe(ref)
    assert status.state == "failed" and not any(n.running for n in status.nodes)
    # The ranks heard SIGTERM and exited like the trainer does: 83.
    assert {r["exit_code"] for n in status.nodes for r in n.ranks} == {83}


def test_drain_sigterms_the_nodes_ranks_which_exit_83(fleet):
    pool = make_pool()
    ref = fleet.launch(request(fleet, pool, "job-8-a1",
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1"}))
    eventually(lambda: progress(ref, 0, 0) >= 1, timeout=60, what="the gang to start stepping")

    fleet.drain(pool, "lab-a-0", grace_s=20)

    status = eventually(lambda: (s := fleet.observe(ref)).state == "failed"
                        and not s.nodes[0].running and s,
                        timeout=30, what="the drained node to end")
    drained = status.nodes[0]
    assert (drained.exit_code, drained.signal) == (83, None)
    assert [r["exit_code"] for r in drained.ranks] == [83]
    assert {n.name: n.unschedulable for n in fleet.list_nodes(pool)}["lab-a-0"] is True
    fleet.stop(ref, grace_s=2)


def test_drain_kills_ranks_that_ignore_sigterm_after_grace(fleet):
    pool = make_pool()
    ref = fleet.launch(request(fleet, pool, "job-9-a1",
                               env={"REGATTA_TEST_STEPS": "400", "REGATTA_TEST_STEP_S": "0.1",
                                    "REGATTA_TEST_IGNORE_TERM": "1"}))
    eventually(lambda: progress(ref, 0, 0) >= 1, timeout=60, what="the gang to start stepping")
    rank = [p for p in procs.scan(attempt_dir=ref["dir"], node="lab-a-0") if p.rank == 0][0]

    fleet.drain(pool, "lab-a-0", grace_s=1)

    assert alive(rank.pid), "drain returns before the grace period ends"
    eventually(lambda: not alive(rank.pid), timeout=20, what="the killer to end the rank")
    # The peer node may report the broken gang first; wait for the drained node's
    # own launcher to record how its rank ended.
    status = eventually(lambda: (s := fleet.observe(ref)).state == "failed"
                        and not s.nodes[0].running and s,
                        timeout=30, what="the drained node to end")
    assert status.nodes[0].signal == signal.SIGKILL
    fleet.stop(ref, grace_s=2)


def test_a_launch_that_died_half_way_is_started_over_cleanly(fleet):
    pool = make_pool()
    req = request(fleet, pool, "job-10-a1", nodes=1)
    # What a worker killed between starting a launcher and writing ref.json leaves.
    stale = Path(fleet.root) / "attempts" / "job-10-a1" / "node-0"
    (stale / "status").mkdir(parents=True)
    (stale / "exit.json").write_text('{"exit_code": 1, "signal": null}')
    (stale / "status" / "rank-0.json").write_text('{"rank": 0, "exit_code": 1}')

    ref = fleet.launch(req)
    status = wait_done(fleet, ref)

    assert status.state == "succeeded", status.message
    assert [r["exit_code"] for r in status.nodes[0].ranks] == [0]


WORKER_SECRETS = {
    "DATABASE_URL": "postgres://regatta:hunter2@db/regatta", "SECRET_KEY": "not-for-ranks",
    "REDIS_URL": "redis://:hunter2@redis:6379/0", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "REGATTA_LOCK_TTL_S": "7",
}


def test_ranks_run_the_jobs_code_without_the_workers_secrets(fleet, monkeypatch):
    for name, value in {**WORKER_SECRETS, "NCCL_DEBUG": "INFO"}.items():
        monkeypatch.setenv(name, value)
    ref = fleet.launch(request(fleet, make_pool(), "job-9-a1",
                               env={"REGATTA_TEST_DUMP_ENV": "1", "REGATTA_TOKEN": "rgw_9_t"}))

    status = wait_done(fleet, ref)

    assert status.state == "succeeded", status.message
    for rank in (0, 1):
        seen = json.loads((Path(ref["dir"]) / f"node-{rank}" / "status" / f"env-{rank}.json")
                          .read_text())
        assert not set(WORKER_SECRETS) & set(seen), f"rank {rank} saw a worker secret"
        # What the collectives and Python need still gets through, and the
        # trainer's own variables are there.
        assert seen["NCCL_DEBUG"] == "INFO" and seen["PATH"] == os.environ["PATH"]
        assert seen["REGATTA_TOKEN"] == "rgw_9_t" and seen["REGATTA_NODE"] == f"lab-a-{rank}"


def test_torchrun_waits_longer_than_any_stop_grace_before_killing_its_ranks():
    """torchrun's own 30 s default would SIGKILL a rank that is still writing
    its emergency checkpoint while stop() is prepared to wait longer."""
    from clusters.providers.local.attempts import torchrun_argv
    from clusters.settings import ClusterSettings

    argv = torchrun_argv("python", 2, 0, 1, 29500, ())
    timeout = int(next(a for a in argv if a.startswith("--shutdown-timeout=")).split("=")[1])
    assert timeout > ClusterSettings().stop_grace_s
    assert timeout > 30
