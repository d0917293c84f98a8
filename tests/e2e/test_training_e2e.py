"""A 2-node job trains to completion on real torchrun processes, reporting
over real HTTP; a rank killed twice mid-run is recovered with no person in
the loop and the run ends bitwise equal to an uninterrupted one."""

import pytest
import torch

from checkpoints.models import ModelArtifact
from clusters.models import Node
from jobs.models import JobAttempt, JobEvent, Phase

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def phase(job):
    job.refresh_from_db()
    return job.phase


def running_attempt(job, number, min_step):
    def check():
        attempt = job.attempts.filter(number=number, state="running").first()
        return attempt if attempt and attempt.last_step >= min_step else None
    return check


@pytest.mark.timeout(400)
def test_a_two_node_job_survives_two_killed_ranks_and_ends_bitwise_equal_to_an_uninterrupted_run(
        fleet):
    cluster = fleet.cluster(size=4, spares=1)
    steady = fleet.submit(cluster, name="steady", max_steps=30, step_sleep_s=0.15)
    killed = fleet.submit(cluster, name="killed", max_steps=30, step_sleep_s=0.15)
    provider = fleet.provider(cluster)

    first = fleet.wait("attempt 1 past step 7", running_attempt(killed, 1, 7), job=killed)
    victim_1 = first.placements.get(node_rank=1).node
    provider.kill_rank(first.provider_ref, rank=1)
    second = fleet.wait("attempt 2 past step 17", running_attempt(killed, 2, 17), timeout=180,
                        job=killed)
    victim_2 = second.placements.get(node_rank=1).node
    provider.kill_rank(second.provider_ref, rank=1)

    fleet.wait("both jobs succeeded",
               lambda: phase(steady) == Phase.SUCCEEDED and phase(killed) == Phase.SUCCEEDED,
               timeout=240, job=killed if phase(steady) == Phase.SUCCEEDED else steady)

    # The uninterrupted run: model exported, nodes released.
    a = ModelArtifact.objects.get(job=steady)
    assert a.sha256 and a.bytes > 0
    assert not JobAttempt.objects.filter(job=steady).exclude(state="succeeded").exists()
    assert JobEvent.objects.filter(job=steady, kind="NodesReleased").exists()
    # The killed run recovered by itself, twice, in place on the same nodes
    # (class process): a death with no sign from the node is no evidence
    # against it, and a second one there makes it a suspect to check, not
    # a node to retire (jobs/recovery/evidence.py; this cluster runs no
    # preflight, so it stays in service unchecked).
    assert killed.attempts.count() == 3
    assert victim_2 == victim_1
    assert killed.restart_counts == {"process": 2}
    victim_1.refresh_from_db()
    assert victim_1.state == Node.State.READY and victim_1.failure_count == 0
    kinds = list(killed.events.values_list("kind", flat=True))
    assert kinds.count("RankDied") == 2
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & set(kinds)
    resumed = list(killed.events.filter(kind="ResumedFromCheckpoint").order_by("id"))
    assert len(resumed) == 2
    assert resumed[0].evidence["step"] >= 5 and resumed[1].evidence["step"] >= 15
    assert killed.attempts.get(number=3).resume_step == resumed[1].evidence["step"]
    # No rollback: each time the surviving rank wrote the last step it had
    # completed (no collective), or that step had just been checkpointed
    # (nothing to hand over), and the relaunch resumed from it.
    handed = [e.evidence["step"]
              for e in killed.events.filter(kind="TrainerSurvivorHandover").order_by("id")]
    assert set(handed) <= {e.evidence["step"] for e in resumed}, fleet.story(killed)
    assert [e.evidence["steps_lost"] for e in resumed] == [0, 0], fleet.story(killed)
    # Bitwise: the same weights as the run nobody touched.
    b = ModelArtifact.objects.get(job=killed)
    mine = torch.load(b.uri, weights_only=False)
    theirs = torch.load(a.uri, weights_only=False)
    assert mine.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
    # The ledger says what the resumes say. Whether a survivor's hand-over
    # is recorded before the failure is handled or after it is a race
    # between two processes; after it, the resume lowers the line booked
    # against the periodic save (jobs/recovery/resume.py). Either way no
    # line claims more than its resume lost.
    lost_at_resume = {e.attempt.number - 1: e.evidence["seconds_lost"] for e in resumed}
    for line in killed.goodput.filter(category="rollback").select_related("attempt"):
        assert line.detail.endswith(": 0 steps lost"), fleet.story(killed)
        assert line.seconds <= lost_at_resume[line.attempt.number] + 0.01, line.detail
    # Two restarts, and the first attempt's start-up from its admission.
    assert killed.goodput.filter(category="restart", key__startswith="restart-").count() == 2
    assert killed.goodput.filter(category="startup", key__startswith="startup-").count() == 1
    assert not killed.goodput.filter(category="restart", key__startswith="startup-").exists()
