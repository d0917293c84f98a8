"""Blame only with evidence, through a real Slurm with real torchrun ranks
(tests/support/slurm_cluster.py): a plain torchrun program whose rank 1
exits 1 ends in a crash loop with its own error line and drains no node; a
request no node can ever meet ends at once with Slurm's words; a cancel is
CANCELLED in Slurm's accounting; and a gang placed on a node an admin
drains before it starts moves to other nodes."""

from pathlib import Path

import pytest

from clusters.models import Node, NodePool
from jobs.models import Phase, TrainingJob
from tests.support.waiting import eventually

from .test_slurm_e2e import phase, slurm_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BUGGY = '''\
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(300):
    print("a chatty training loop says a lot of things", flush=True)
if dist.get_rank() == 1:
    raise ValueError("bad learning rate: -1")
dist.barrier()
'''


def sacct_state(slurm_world, job_id) -> str:
    def ended():
        out = slurm_world.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", str(job_id))
        rows = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        state = rows.get(str(job_id), "RUNNING").split()[0]
        return state if state not in ("RUNNING", "COMPLETING", "PENDING") else None
    return eventually(ended, timeout=60, interval=0.5, what="sacct to have the job's end")


@pytest.mark.timeout(420)
def test_a_program_whose_rank_fails_every_time_ends_in_a_crash_loop_and_drains_no_node(
        slurm_world, fleet, tmp_path):
    cluster = slurm_cluster(slurm_world, fleet.root)
    script = Path(tmp_path) / "buggy.py"
    script.write_text(BUGGY)
    job = fleet.submit(cluster, name="buggy")
    TrainingJob.objects.filter(pk=job.pk).update(
        entrypoint=[str(script)], completion=TrainingJob.Completion.EXIT)

    fleet.wait("the job to fail", lambda: phase(job) == Phase.FAILED, job=job, timeout=360)

    job.refresh_from_db()
    assert job.attempts.count() == 3, fleet.story(job)
    assert set(job.attempts.values_list("failure_class", flat=True)) == {"process"}
    assert job.last_error.startswith("crash loop: the same failure 3 times in a row")
    assert "ValueError: bad learning rate: -1" in job.last_error
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & set(
        job.events.values_list("kind", flat=True))
    # No node out in Regatta, none drained in Slurm.
    assert set(Node.objects.filter(cluster=cluster).values_list("state", flat=True)) == {
        "ready"}
    for name in ("n1", "n2", "n3", "n4"):
        assert "DRAIN" not in slurm_world.node(name)["State"], name


@pytest.mark.timeout(240)
def test_a_request_no_node_can_meet_ends_the_job_with_slurms_words(slurm_world, fleet):
    cluster = slurm_cluster(slurm_world, fleet.root)
    # Four GPUs a node on nodes that have two.
    NodePool.objects.filter(cluster=cluster).update(gpus_per_node=4)
    job = fleet.submit(cluster, name="too-big", gpus=16)

    fleet.wait("the job to fail", lambda: phase(job) == Phase.FAILED, job=job, timeout=120)

    job.refresh_from_db()
    assert "Requested node configuration is not available" in job.last_error
    failed = job.events.get(kind="CannotRun")
    assert "Slurm refuses the attempt for good" in failed.message
    assert job.attempts.count() == 1
    assert not job.conditions or not any(c.get("type") == "ReconcileError"
                                         for c in job.conditions)


@pytest.mark.timeout(300)
def test_a_cancelled_job_is_cancelled_in_slurms_accounting(slurm_world, fleet):
    cluster = slurm_cluster(slurm_world, fleet.root)
    job = fleet.submit(cluster, name="to-cancel", max_steps=2000, step_sleep_s=0.2)
    attempt = fleet.wait("attempt 1 running", lambda: job.attempts.filter(
        number=1, state="running", last_step__gte=2).first(), job=job, timeout=150)

    job.request_cancel("test")
    from jobs import tasks

    tasks.reconcile_job.delay(job.id)
    fleet.wait("the job cancelled", lambda: phase(job) == Phase.CANCELLED, job=job, timeout=90)

    assert sacct_state(slurm_world, attempt.provider_ref["job_id"]) == "CANCELLED"


@pytest.mark.timeout(300)
def test_a_gang_waiting_on_a_node_its_admin_drained_moves_to_other_nodes(slurm_world, fleet):
    """Placed on n1..n2, its Slurm job pending because another job holds
    n2; the admin drains n2 meanwhile: Regatta follows the drain (n2
    cordoned, held by the scheduler) and relaunches the gang elsewhere
    rather than waiting for n2 with ReqNodeNotAvail."""
    cluster = slurm_cluster(slurm_world, fleet.root)
    blocker = slurm_world.run("sbatch", "--parsable", "-p", "gpu", "-w", "n2", "--exclusive",
                              "--output=/dev/null", "--wrap", "sleep 600").strip()
    eventually(lambda: slurm_world.job(blocker)["JobState"] == "RUNNING", timeout=30,
               what="the other user's job to hold n2")
    job = fleet.submit(cluster, name="waits", max_steps=20, step_sleep_s=0.1)
    first = fleet.wait("attempt 1 waiting to start", lambda: job.attempts.filter(
        number=1, state="starting").exclude(provider_ref={}).first(), job=job, timeout=120)
    placed = {p.node.name for p in first.placements.select_related("node")}
    assert placed == {"n1", "n2"}, "a gang takes the pool's free nodes in name order"

    slurm_world.run("scontrol", "update", "nodename=n2", "state=drain", "reason=bad fan")

    second = fleet.wait("attempt 2 on other nodes", lambda: job.attempts.filter(
        number=2).exclude(provider_ref={}).first(), job=job, timeout=120)
    n2 = Node.objects.get(cluster=cluster, name="n2")
    assert n2.state == "cordoned" and n2.admin_hold.startswith("bad fan")
    assert "n2" not in {p.node.name for p in second.placements.select_related("node")}
    assert refreshed_class(first) == "preempted"
    restarting = job.events.filter(kind="Restarting").first()
    assert restarting.evidence["charged_to_job"] is False
    slurm_world.run("scancel", blocker)
    fleet.wait("the job to succeed", lambda: phase(job) == Phase.SUCCEEDED, job=job,
               timeout=180)


def refreshed_class(attempt) -> str:
    attempt.refresh_from_db()
    return attempt.failure_class

