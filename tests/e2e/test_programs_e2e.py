"""Programs of a team's own, on the local fleet's real torchrun ranks: the
plain DDP example with no Regatta code (examples/train_ddp.py) and the same
script with the SDK's few lines (examples/train_ddp_sdk.py), each a 2-node
job whose node is killed mid-run."""

from pathlib import Path

import pytest

from checkpoints.models import ModelArtifact
from clusters.providers import pool_info
from jobs.checkpointing import job_checkpoint_uri
from jobs.models import MetricPoint, Phase, TrainingJob

from .test_failures_e2e import refreshed, running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def submit_program(fleet, cluster, script: str, **hyper) -> TrainingJob:
    job = fleet.submit(cluster, name=script.removesuffix(".py"))
    TrainingJob.objects.filter(pk=job.pk).update(
        entrypoint=[str(EXAMPLES / script)], hyperparameters=hyper,
        completion=TrainingJob.Completion.EXIT, checkpoint_every_steps=20)
    return refreshed(job)


def kill_a_node(fleet, cluster, attempt):
    node = attempt.placements.get(node_rank=1).node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "kill")
    return node


def node_logs(attempt) -> str:
    return "\n".join(p.read_text(errors="replace")
                     for p in Path(attempt.provider_ref["dir"]).glob("node-*/stdout.log"))


@pytest.mark.timeout(300)
def test_a_plain_ddp_script_survives_a_node_kill_and_succeeds_when_it_exits_0(fleet):
    cluster = fleet.cluster()
    job = submit_program(fleet, cluster, "train_ddp.py", steps=600, sleep=0.1, save_every=20)

    # No heartbeats ever: it shows running (no heartbeats) by its processes.
    fleet.wait("running without heartbeats",
               lambda: refreshed(job).phase == Phase.RUNNING and job.heartbeats_missing,
               job=job)
    folder = Path(job_checkpoint_uri(job))
    fleet.wait("its own ckpt-20.pt", lambda: (folder / "ckpt-20.pt").exists(), job=job)
    first = job.attempts.get(number=1)
    kill_a_node(fleet, cluster, first)

    fleet.wait("attempt 2 launched", lambda: job.attempts.filter(number=2).exists(), job=job,
               timeout=150)
    fleet.wait("the job succeeded", lambda: refreshed(job).phase == Phase.SUCCEEDED, job=job,
               timeout=200)
    second = job.attempts.get(number=2)
    assert second.failure_class == "" and second.exit_code == 0
    assert refreshed(first).failure_class == "hardware"
    assert "resumed from" in node_logs(second)  # its own file, found in REGATTA_CHECKPOINT_URI
    kinds = list(job.events.values_list("kind", flat=True))
    assert "FinalCheckpointMissing" not in kinds and kinds[-2:] == ["Succeeded", "NodesReleased"]


@pytest.mark.timeout(300)
def test_the_sdk_script_reports_resumes_verified_and_exports(fleet):
    cluster = fleet.cluster()
    job = submit_program(fleet, cluster, "train_ddp_sdk.py", steps=300, sleep=0.1)

    first = fleet.wait("attempt 1 past step 25", running(job, 1, 25), job=job)
    assert MetricPoint.objects.filter(job=job, name="loss").exists()  # live curves
    assert not refreshed(job).heartbeats_missing
    fleet.wait("a committed checkpoint", lambda: job.checkpoints.filter(
        state__in=("committed", "verified")).exists(), job=job)
    kill_a_node(fleet, cluster, first)

    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    assert second.resume_step is not None and second.resume_step >= 20
    assert second.resume_step % 20 == 0
    fleet.wait("the job succeeded", lambda: refreshed(job).phase == Phase.SUCCEEDED, job=job,
               timeout=200)
    assert refreshed(job).current_step == 300
    artifact = ModelArtifact.objects.get(job=job)
    assert artifact.checkpoint.step == 300 and artifact.format == "torch"
