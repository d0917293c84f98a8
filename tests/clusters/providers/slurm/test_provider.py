"""The Slurm provider against a real slurmctld and slurmds (tests/support/
slurm_cluster.py): attempts are sbatch jobs whose ranks are real torchrun
processes (gloo on CPU), kept to a few steps."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from clusters.providers.base import LaunchRequest, Placement, PoolInfo
from clusters.providers.slurm import SlurmPoolSettings, SlurmProvider, SlurmSettings, attempts
from tests.support.local_fleet import RANKS_SCRIPT, progress
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NANO_TRAINER = {"model": "nano", "batch_size": 4, "max_steps": 4, "warmup_steps": 1,
                "log_every_steps": 2, "heartbeat_interval_s": 0.5}
LONG = {"REGATTA_TEST_STEPS": "600", "REGATTA_TEST_STEP_S": "0.1"}


@pytest.fixture
def provider(slurm_world, tmp_path):
    provider = SlurmProvider("lab", SlurmSettings(slurm_conf=slurm_world.conf, partition="gpu",
                                                  shared_dir=str(tmp_path / "shared")))
    yield provider


def pool(gpus: int = 2, **settings) -> PoolInfo:
    return PoolInfo(cluster="lab", name="a", instance_type="slurm", gpus_per_node=gpus,
                    settings=SlurmPoolSettings(**settings))


def request(name: str, nodes: tuple[str, ...] = ("n1", "n2"), env: dict | None = None,
            command: tuple[str, ...] | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id=1, attempt_id=1, attempt_number=1, name=name, pool=pool(),
        placements=tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes)),
        nproc_per_node=1, image="slurm", command=(RANKS_SCRIPT,) if command is None else command,
        env={"REGATTA_TEST_STEPS": "3", **(env or {})},
    )


def wait_done(provider, ref, timeout=120):
    return eventually(lambda: (s := provider.observe(ref)).state != "running" and s,
                      timeout=timeout, interval=0.3, what="the attempt to end")


def test_it_lists_the_partitions_nodes_with_their_slurm_state(provider, slurm_world):
    nodes = provider.list_nodes(pool())

    assert [n.name for n in nodes] == ["n1", "n2", "n3", "n4"], "partition spare is not gpu"
    assert all(n.ready and not n.unschedulable and n.gpus == 2 for n in nodes)
    assert nodes[0].conditions["State"] == "IDLE"
    assert [n.name for n in provider.list_nodes(pool(partition="spare"))] == ["n5", "n6"]


def test_a_two_node_attempt_of_the_trainer_runs_as_one_sbatch_job(provider, slurm_world,
                                                                  tmp_path):
    ckpt = tmp_path / "ckpt"
    req = request("job-1-a1", nodes=("n3", "n1"), command=("-m", "trainer"),
                  env={"REGATTA_CONFIG": json.dumps(NANO_TRAINER),
                       "REGATTA_CHECKPOINT_URI": str(ckpt), "REGATTA_RESUME_STEP": "none"})
    ref = provider.launch(req)
    assert provider.launch(req) == ref, "a second launch of the same attempt submits nothing"

    status = wait_done(provider, ref)

    assert status.state == "succeeded", status.message + "\n" + status.nodes[0].log_tail
    assert [(n.node, n.node_rank, n.exit_code, n.signal) for n in status.nodes] == [
        ("n3", 0, 0, None), ("n1", 1, 0, None)]
    assert [[r["rank"] for r in n.ranks] for n in status.nodes] == [[0], [1]]
    assert (ckpt / "step-4" / "COMMITTED").exists()
    # Every node's exit record says 0 before Slurm has seen srun and the batch
    # shell end (RUNNING) and finished COMPLETING.
    job = eventually(lambda: (j := slurm_world.job(ref["job_id"]))["JobState"]
                     not in ("RUNNING", "COMPLETING") and j, timeout=30,
                     what="Slurm to complete the job")
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0"
    assert job["NodeList"] == "n[1,3]" and job["Requeue"] == "0"
    assert job["JobName"] == "job-1-a1" and job["Comment"] == "regatta:lab"


def test_a_rank_that_fails_fails_the_attempt_with_its_exit_code(provider, slurm_world):
    ref = provider.launch(request("job-2-a1", env={"REGATTA_TEST_EXIT": "3"}))

    status = wait_done(provider, ref)

    # Failed as soon as one node's torchrun ended so, the other still running.
    assert status.state == "failed"
    assert "exit code 3" in status.message
    first = [n for n in status.nodes if not n.running]
    assert first and {(n.exit_code, n.signal) for n in first} == {(3, None)}
    assert not any(n.node_lost for n in status.nodes), "a code error is no node's fault"
    job = eventually(lambda: (j := slurm_world.job(ref["job_id"]))["JobState"]
                     not in ("RUNNING", "COMPLETING") and j, timeout=30,
                     what="Slurm to end the job")
    assert job["JobState"] == "FAILED" and job["Restarts"] == "0"
    # Once Slurm has ended the job, every node's exit is on record.
    over = provider.observe(ref)
    assert over.state == "failed"
    assert [(n.running, n.exit_code, n.signal) for n in over.nodes] == [(False, 3, None)] * 2
    # The accounting (slurmdbd, `sacct`) says the same as slurmctld: what
    # observe reads once slurmctld forgets the job after MinJobAge.
    # slurmdbd hears of the job's end a moment after slurmctld.
    accounted = eventually(lambda: (a := provider.slurm.accounted(ref["job_id"]))
                           and a["JobState"] not in attempts.ACTIVE and a, timeout=30,
                           what="sacct to have the job's end")
    assert (accounted["JobState"], accounted["ExitCode"], accounted["NodeList"]) == (
        job["JobState"], job["ExitCode"], job["NodeList"])
    assert provider.slurm.accounted("999999") == {}  # a job nobody ran


def test_stop_scancels_the_job_and_leaves_nothing_running(provider, slurm_world):
    ref = provider.launch(request("job-3-a1", env=LONG))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=90, what="the gang to step")
    assert slurm_world.job_processes(ref["job_id"])

    provider.stop(ref, grace_s=15)
    provider.stop(ref, grace_s=15)

    # The steps heard SIGTERM and ended by themselves (FAILED: srun's exit 83);
    # had they not, the scancel after the grace would have (CANCELLED).
    assert slurm_world.job(ref["job_id"])["JobState"] in ("FAILED", "CANCELLED")
    eventually(lambda: not slurm_world.job_processes(ref["job_id"]), timeout=30,
               what="every process of the job to end")
    status = provider.observe(ref)
    assert status.state == "failed" and not any(n.running for n in status.nodes)
    # SIGTERM first: the ranks exited as the trainer does when asked to stop.
    assert {r["exit_code"] for n in status.nodes for r in n.ranks} == {83}


def test_a_job_on_a_cordoned_node_waits_with_slurms_reason(provider, slurm_world):
    provider.cordon(pool(), "n4")
    assert slurm_world.node("n4")["Reason"].startswith("regatta: cordoned")
    assert {n.name: n.unschedulable for n in provider.list_nodes(pool())}["n4"] is True
    ref = provider.launch(request("job-4-a1", nodes=("n4",)))

    status = eventually(lambda: (s := provider.observe(ref)).start_issues and s, timeout=30,
                        what="Slurm to say why the job waits")

    assert status.state == "running" and not status.user_errors
    assert status.start_issues[0].reason.startswith("ReqNodeNotAvail")
    provider.stop(ref, grace_s=5)
    assert slurm_world.job(ref["job_id"])["JobState"] == "CANCELLED"
    provider.uncordon(pool(), "n4")
    assert "DRAIN" not in slurm_world.node("n4")["State"]


def test_a_node_whose_slurmd_dies_is_down_and_fails_its_attempt(provider, slurm_world):
    ref = provider.launch(request("job-5-a1", env=LONG))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=90, what="the gang to step")

    slurm_world.lose_node("n2")
    # Not responding at once; DOWN, with Slurm's reason, after SlurmdTimeout (10 s).
    eventually(lambda: "DOWN" in slurm_world.node("n2")["State"], timeout=60, interval=0.5,
               what="Slurm to call n2 DOWN")

    status = eventually(lambda: (s := provider.observe(ref)).state == "failed"
                        and s.nodes[1].node_lost and s, timeout=60,
                        what="the attempt to fail with n2 lost")
    lost = status.nodes[1]
    assert (lost.node, lost.running, lost.signal) == ("n2", False, 9)
    assert "DOWN" in lost.node_lost
    # Reported not ready with Slurm's own words: the cluster reconcile fails
    # it once that outlasts its grace (a controller restart does not).
    nodes = {n.name: n for n in provider.list_nodes(pool())}
    assert nodes["n2"].ready is False and nodes["n1"].ready is True
    assert "DOWN" in nodes["n2"].conditions["State"]
    assert nodes["n2"].conditions["Reason"].startswith("Not responding")
    assert nodes["n2"].admin_hold == "", "Slurm's own verdict, not an admin's hold"
    provider.stop(ref, grace_s=5)
    job = slurm_world.job(ref["job_id"])
    assert job["JobState"] in ("NODE_FAIL", "CANCELLED") and job["Restarts"] == "0", (
        "Slurm's own requeue stays off")
    assert Path(ref["dir"], "batch.sh").exists()


def test_a_node_lost_with_its_launcher_is_known_before_slurm_calls_it_down(provider,
                                                                          slurm_world):
    """The survivor's collective fails at once; Slurm calls the lost node
    not responding, then DOWN, only after its SlurmdTimeout. A node whose
    launcher stopped beating with no exit record, once a peer's part has
    failed, went with its ranks: the attempt fails with that node lost,
    seconds after the loss, on the launchers' word."""
    ref = provider.launch(request("job-7-a1", env=LONG))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=90, what="the gang to step")
    assert (Path(ref["dir"]) / "node-1" / "beat.json").exists(), "the launcher beats"

    slurm_world.lose_node("n2")
    status = eventually(lambda: (s := provider.observe(ref)).state == "failed"
                        and s.nodes[1].node_lost and s, timeout=60, interval=0.2,
                        what="the attempt to fail with n2 lost")

    survivor, lost = status.nodes
    assert (survivor.node, survivor.running, survivor.exit_code) == ("n1", False, 1), (
        "n1's all-reduce failed on its peer's loss, and its launcher said so")
    assert (lost.node, lost.running, lost.signal) == ("n2", False, 9)
    assert "launcher went silent" in lost.node_lost, (
        "known from the launchers, before Slurm's DOWN: " + lost.node_lost)
    assert "node n2 (rank 1)" in status.message, "the lost node is named as the cause"
    provider.stop(ref, grace_s=5)


def test_a_rank_that_dies_alone_leaves_its_node_beating_and_not_lost(provider, slurm_world):
    """A rank SIGKILLed on a healthy node (the OOM killer's pick): its
    launcher records how torchrun ended, so no node counts as lost."""
    ref = provider.launch(request("job-8-a1", env=LONG))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=90, what="the gang to step")
    launcher = json.loads((Path(ref["dir"]) / "node-1" / "launcher.json").read_text())
    pid = launcher["torchrun_pid"]
    ranks = [int(r) for r in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    assert ranks, "torchrun's rank on n2"
    os.kill(ranks[0], signal.SIGKILL)

    status = eventually(lambda: (s := provider.observe(ref)).state == "failed"
                        and not any(n.running for n in s.nodes) and s, timeout=60,
                        interval=0.3, what="both nodes' parts to end")
    assert not any(n.node_lost for n in status.nodes), [n.node_lost for n in status.nodes]
    assert status.nodes[1].signal == 9 and not status.nodes[1].running
    provider.stop(ref, grace_s=5)


def test_a_restarted_control_plane_finds_its_slurm_jobs_again(provider, slurm_world, tmp_path):
    """A new provider, as a restarted worker builds it, holds nothing in
    memory: what it knows is the attempt's ref (in the database) and
    Slurm. A launch that died between sbatch and its ref.json adopts the
    job Slurm has under the attempt's name rather than submitting another."""
    ref = provider.launch(request("job-5-a1", env=LONG))
    eventually(lambda: progress(ref, 1, 1) >= 1, timeout=90, what="the gang to step")

    restarted = SlurmProvider("lab", SlurmSettings(slurm_conf=slurm_world.conf, partition="gpu",
                                                   shared_dir=str(tmp_path / "shared")))
    status = restarted.observe(ref)
    assert status.state == "running" and all(n.running for n in status.nodes)
    assert [n.node for n in status.nodes] == ["n1", "n2"]

    (Path(ref["dir"]) / "ref.json").unlink()
    assert restarted.launch(request("job-5-a1", env=LONG)) == ref
    assert slurm_world.run("squeue", "-h", "-n", "job-5-a1", "-o", "%i").split() == [
        ref["job_id"]], "one job per attempt"

    restarted.stop(ref, grace_s=10)
    eventually(lambda: not slurm_world.job_processes(ref["job_id"]), timeout=30,
               what="every process of the job to end")


def test_the_preflight_all_reduces_across_the_chosen_nodes_as_a_slurm_job(provider,
                                                                         slurm_world):
    placements = (Placement(node="n3", node_rank=0), Placement(node="n1", node_rank=1))

    result = provider.preflight(pool(), placements, timeout_s=90)

    assert result.ok, result.message
    assert result.evidence["method"] == "allreduce"
    assert set(result.evidence["per_node"]) == {"n1", "n3"}
    assert all(c["ok"] and c["busbw_gbps"] > 0 for c in result.evidence["per_node"].values())
    # It ran through Slurm, on exactly those nodes, and is over.
    job = slurm_world.job(result.evidence["slurm_job"])
    assert slurm_world.run("scontrol", "show", "hostnames", job["NodeList"]).split() == [
        "n1", "n3"]
    assert job["JobState"] in ("COMPLETED", "COMPLETING", "CANCELLED")


def test_a_spare_is_checked_inside_its_reservation_and_leaves_it_when_launched_on(
        provider, slurm_world):
    """hold_spares keeps exactly the pool's spares reserved; a spare's
    join-time check runs in the reservation, and a launch takes its nodes
    out of it first, so Slurm does not hold the attempt back for it."""
    provider.hold_spares(pool(), ["n3", "n4"])
    assert slurm_world.reservations()["regatta-lab-a-spares"]["Nodes"] == "n[3-4]"
    provider.hold_spares(pool(), ["n3", "n4"])  # idempotent
    # Slurm flags a reserved node once the reservation is active: the
    # spare's own reservation is no reason against it.
    eventually(lambda: "RESERVED" in slurm_world.node("n4")["State"], timeout=60,
               what="n4 flagged RESERVED")

    check = provider.preflight(pool(), (Placement(node="n4", node_rank=0),), timeout_s=90)
    assert check.ok, check.message
    assert slurm_world.reservations()["regatta-lab-a-spares"]["Nodes"] == "n[3-4]"

    ref = provider.launch(request("job-9-a1", nodes=("n1", "n4")))
    assert slurm_world.reservations()["regatta-lab-a-spares"]["Nodes"] == "n3"
    assert wait_done(provider, ref).state == "succeeded"

    provider.hold_spares(pool(), [])
    assert "regatta-lab-a-spares" not in slurm_world.reservations()


def test_a_drained_node_fails_the_preflight_on_slurms_word_without_a_job(provider,
                                                                       slurm_world):
    provider.cordon(pool(), "n2")
    placements = (Placement(node="n1", node_rank=0), Placement(node="n2", node_rank=1))

    result = provider.preflight(pool(), placements, timeout_s=30)

    assert not result.ok and result.failed_nodes == ("n2",)
    assert result.evidence["method"] == "slurm-state"
    assert "DRAIN" in result.evidence["per_node"]["n2"]["error"]
    assert not slurm_world.run("squeue", "-h"), "no job submitted"
