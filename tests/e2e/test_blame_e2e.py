"""Blame only with evidence, on the local fleet's real torchrun ranks: a
program's deterministic bug ends the job with the user's own error line and
retires no node, and a rank killed twice on a healthy node is checked and
kept (jobs/recovery/)."""

from pathlib import Path

import pytest

from clusters.models import Node
from jobs.models import Phase, TrainingJob

from .test_failures_e2e import cancel_and_wait, refreshed, running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A plain torchrun program (no SDK) whose rank 1 raises after the gang
# formed, on every attempt: the deterministic bug of a team's own code.
BUGGY = '''\
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} up", flush=True)
for _ in range(200):
    print("a chatty training loop says a lot of things", flush=True)
if dist.get_rank() == 1:
    raise ValueError("bad learning rate: -1")
dist.barrier()
'''


@pytest.mark.timeout(300)
def test_a_program_that_fails_the_same_way_every_time_ends_in_a_crash_loop_and_keeps_the_fleet(
        fleet, tmp_path):
    cluster = fleet.cluster(size=2, spares=1)
    working = sorted(Node.objects.filter(cluster=cluster).values_list("name", "is_spare"))
    script = Path(tmp_path) / "buggy.py"
    script.write_text(BUGGY)
    job = fleet.submit(cluster, name="buggy")
    TrainingJob.objects.filter(pk=job.pk).update(
        entrypoint=[str(script)], completion=TrainingJob.Completion.EXIT)

    fleet.wait("the job to fail", lambda: refreshed(job).phase == Phase.FAILED, job=job,
               timeout=240)

    assert job.attempts.count() == 3, fleet.story(job)
    assert set(job.attempts.values_list("failure_class", flat=True)) == {"process"}
    assert job.last_error.startswith("crash loop: the same failure 3 times in a row")
    # The user's own line, found in a log that a 2,000-character tail misses.
    assert "ValueError: bad learning rate: -1" in job.last_error
    assert 'raise ValueError("bad learning rate: -1")' in job.last_error
    loop = job.events.get(kind="CrashLoop")
    assert loop.evidence["error"]["line"] == "ValueError: bad learning rate: -1"
    # Not one node retired: every node ready, none failed, the pool as it was.
    assert sorted(Node.objects.filter(cluster=cluster).values_list("name", "is_spare")) == working
    assert set(Node.objects.filter(cluster=cluster).values_list("state", flat=True)) == {"ready"}
    assert not Node.objects.filter(cluster=cluster, failure_count__gt=0).exists()
    kinds = set(job.events.values_list("kind", flat=True))
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & kinds


@pytest.mark.timeout(300)
def test_a_rank_killed_twice_on_a_healthy_node_is_checked_and_the_node_stays(fleet):
    cluster = fleet.cluster(size=2, spares=1, preflight=True)
    job = fleet.submit(cluster, max_steps=400, step_sleep_s=0.1)
    provider = fleet.provider(cluster)
    first = fleet.wait("attempt 1 running", running(job, 1, 3), job=job, timeout=150)
    victim = first.placements.get(node_rank=1).node
    provider.kill_rank(first.provider_ref, rank=1)
    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    assert second.placements.get(node_rank=1).node == victim
    provider.kill_rank(second.provider_ref, rank=1)

    third = fleet.wait("attempt 3 running", running(job, 3), job=job, timeout=150)

    assert refreshed(second).failure_class == "process"
    victim.refresh_from_db()
    assert victim.state == Node.State.READY and victim.failure_count == 0
    assert victim.events.filter(reason__startswith="suspect").exists()
    # Checked before the relaunch used it: the preflight ran on it, and passed.
    assert job.events.filter(kind="PreflightPassed", attempt=third).exists()
    assert third.placements.get(node_rank=1).node == victim
    kinds = set(job.events.values_list("kind", flat=True))
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & kinds
    cancel_and_wait(fleet, job)
