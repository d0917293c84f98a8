"""2-node jobs of the built-in trainer through a real Slurm: admitted,
launched as one sbatch job, reporting live over real HTTP, and succeeded,
through the loss of a node too, with no person in the loop
(tests/support/slurm_cluster.py)."""

import pytest
import torch

from checkpoints.models import ModelArtifact
from clusters.models import Cluster, Node, NodePool
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def slurm_cluster(slurm_world, root) -> Cluster:
    cluster = Cluster.objects.create(
        name="hpc", provider=Cluster.Provider.SLURM,
        settings={"slurm_conf": slurm_world.conf, "partition": "gpu",
                  "shared_dir": str(root / "shared"), "preflight": False,
                  "observe_interval_s": 0.5, "queue_interval_s": 1.0,
                  "reconcile_interval_s": 1.0, "heartbeat_deadline_s": 30.0,
                  "first_heartbeat_deadline_s": 120.0, "stop_grace_s": 5.0})
    NodePool.objects.create(cluster=cluster, name="gpu", instance_type="slurm", gpus_per_node=1,
                            size=3, spare_count=1)
    reconcile_cluster_unlocked(cluster.id)
    return cluster


def phase(job):
    job.refresh_from_db()
    return job.phase


@pytest.mark.timeout(420)
def test_a_node_lost_under_a_running_job_is_drained_replaced_and_the_job_resumes_bitwise_equal(
        slurm_world, fleet):
    """A slurmd and the job step on its node SIGKILLed, as a machine losing
    power: Regatta knows it from the launchers before Slurm does, calls the
    node DOWN and drains it, takes the spare, relaunches the gang on
    healthy nodes from the newest verified checkpoint, and the run ends
    with the same weights as its twin with no fault (on the local fleet:
    the same trainer, world size and seeds, so the same bits)."""
    cluster = slurm_cluster(slurm_world, fleet.root)
    twin_cluster = fleet.cluster(name="twin", size=2, spares=0)
    hyper = {"max_steps": 30, "step_sleep_s": 0.15}
    job = fleet.submit(cluster, name="hpc-killed", **hyper)
    twin = fleet.submit(twin_cluster, name="local-twin", team="twin", **hyper)

    first = fleet.wait("attempt 1 past step 7", lambda: job.attempts.filter(
        number=1, state="running", last_step__gte=7).first(), timeout=150, job=job)
    # One sbatch job, on the nodes Regatta placed the gang on, with
    # Slurm's own requeue off, running with live reports (last_step).
    record = slurm_world.job(first.provider_ref["job_id"])
    assert record["JobState"] == "RUNNING" and record["Comment"] == "regatta:hpc"
    assert record["Requeue"] == "0"
    placed = sorted(p.node.name for p in first.placements.all())
    assert slurm_world.run("scontrol", "show", "hostnames", record["NodeList"]).split() \
        == placed, "Slurm ran the gang on the nodes Regatta placed it on"
    victim = first.placements.get(node_rank=1).node
    slurm_world.lose_node(victim.name)

    fleet.wait("both jobs to succeed",
               lambda: phase(job) == Phase.SUCCEEDED and phase(twin) == Phase.SUCCEEDED,
               timeout=240, job=job if phase(twin) == Phase.SUCCEEDED else twin)

    # The node: lost on the launchers' word (the survivor's collective
    # failed at once, the victim's launcher went silent with no exit
    # record), called DOWN in Slurm by Regatta for it so that the job ends
    # without waiting for SlurmdTimeout, drained with Regatta's reason, and
    # replaced in Regatta by the spare.
    victim.refresh_from_db()
    assert victim.state in (Node.State.REPLACED, Node.State.CORDONED), victim.state
    failed = job.events.get(kind="NodeFailed")
    assert failed.evidence["node"] == victim.name
    assert "launcher went silent" in failed.evidence["node_lost"], failed.evidence
    state = slurm_world.node(victim.name)
    assert "DRAIN" in state["State"] and state["Reason"].startswith("regatta: ")
    assert Node.objects.get(cluster=cluster, name="n4").is_spare is False
    # Straight to the spare: no relaunch in place waited for Slurm's DOWN.
    final = job.attempts.order_by("-number").first()
    assert final.state == "succeeded" and final.number == 2
    placed = {p.node.name for p in final.placements.all()}
    assert victim.name not in placed and "n4" in placed, placed
    kinds = list(job.events.values_list("kind", flat=True))
    lost_at = kinds.index("NodeReplaced")
    assert kinds[lost_at - 2:lost_at + 1] == ["NodeFailed", "NodeCordoned", "NodeReplaced"]
    # Resumed from a checkpoint the first attempt committed, not from scratch.
    resumed = list(job.events.filter(kind="ResumedFromCheckpoint").order_by("id"))
    assert resumed and all(e.evidence["step"] >= 5 for e in resumed)
    assert final.resume_step == resumed[-1].evidence["step"]
    # Slurm's accounting tells the same story (`sacct`, as an operator reads
    # it): the first attempt's job ended on the lost node, the second ran
    # to completion on the spare.
    # (slurmdbd hears of a job's end a moment after slurmctld.)
    ids = [str(first.provider_ref["job_id"]), str(final.provider_ref["job_id"])]

    def accounted():
        rows = {line.split("|")[0]: line.split("|")[1:] for line in slurm_world.run(
            "sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList", "-j",
            ",".join(ids)).splitlines()}
        return rows if all(rows.get(i, ["RUNNING"])[0] not in ("RUNNING", "COMPLETING")
                           for i in ids) else None

    accounting = eventually(accounted, timeout=30, what="sacct to have both jobs' ends")
    assert accounting[str(final.provider_ref["job_id"])][0] == "COMPLETED"
    assert accounting[str(first.provider_ref["job_id"])][0].split()[0] in (
        "FAILED", "NODE_FAIL", "CANCELLED"), accounting
    assert victim.name in slurm_world.run(
        "scontrol", "show", "hostnames", accounting[str(first.provider_ref["job_id"])][2])
    # Bitwise: the weights of the run nobody touched.
    mine = torch.load(ModelArtifact.objects.get(job=job).uri, weights_only=False)
    theirs = torch.load(ModelArtifact.objects.get(job=twin).uri, weights_only=False)
    assert mine.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
