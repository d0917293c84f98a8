"""Programs of a team's own, on the local fleet's real torchrun ranks: the
plain DDP example with no Regatta code (examples/train_ddp.py), the same
script with the SDK's few lines (examples/train_ddp_sdk.py) and the FSDP
example (examples/train_fsdp_sdk.py), each a 2-node job whose node is killed
mid-run."""

import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from checkpoints.models import Checkpoint, ModelArtifact
from clusters.models import Node
from clusters.providers import pool_info
from jobs.checkpointing import job_checkpoint_uri
from jobs.metrics.models import MetricPoint
from jobs.models import Phase, TrainingJob
from tests.worker_image.helpers import TORCHRUN, free_port

from .test_failures_e2e import refreshed, running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def submit_program(fleet, cluster, script: str, strategy=TrainingJob.Strategy.DDP,
                   **hyper) -> TrainingJob:
    job = fleet.submit(cluster, name=script.removesuffix(".py"))
    TrainingJob.objects.filter(pk=job.pk).update(
        entrypoint=[str(EXAMPLES / script)], hyperparameters=hyper, strategy=strategy,
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
    # Taken for a program that sends no heartbeats 5 s after its launch, not 20.
    cluster = fleet.cluster(no_heartbeat_grace_s=5.0)
    job = submit_program(fleet, cluster, "train_ddp.py", steps=300, sleep=0.1, save_every=20)

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


def download_model(api, django_user_model, job) -> dict:
    """The exported model as a teammate gets it: listed, then streamed, through
    the API's artifact endpoints."""
    user = django_user_model.objects.create_user(f"member-{job.pk}")
    job.team.members.add(user)
    client = api(user)
    artifact = ModelArtifact.objects.get(job=job)
    listing = client.get(f"/api/v1/artifacts/{artifact.pk}/files/")
    assert listing.status_code == 200, listing.content
    files = {f["path"]: f for f in listing.json()["files"]}
    assert {"model.pt", "config.json"} <= set(files)
    resp = client.get(f"/api/v1/artifacts/{artifact.pk}/files/model.pt")
    assert resp.status_code == 200
    data = b"".join(resp.streaming_content)
    assert hashlib.sha256(data).hexdigest() == files["model.pt"]["sha256"]
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def uninterrupted(tmp_path, script: str, **hyper) -> dict:
    """The same script under plain torchrun on one node, never stopped: its
    final exported weights."""
    folder = tmp_path / "uninterrupted"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
    # The local fleet's ranks run with one thread each: the same kernels here.
    env.update(OMP_NUM_THREADS="1", REGATTA_CHECKPOINT_URI=str(folder / "ckpt"),
               REGATTA_CONFIG=json.dumps(hyper))
    proc = subprocess.run(
        [TORCHRUN, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(EXAMPLES / script)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = folder / "ckpt" / f"step-{hyper['steps']}" / "export" / "model.pt"
    return torch.load(final, map_location="cpu", weights_only=True)


@pytest.mark.timeout(420)
def test_the_sdk_script_reports_resumes_verified_and_exports(fleet, api, django_user_model,
                                                             tmp_path):
    cluster = fleet.cluster()
    job = submit_program(fleet, cluster, "train_ddp_sdk.py", steps=300, sleep=0.1)

    first = fleet.wait("attempt 1 past step 25", running(job, 1, 25), job=job)
    assert MetricPoint.objects.filter(job=job, name="loss").exists()  # live curves
    assert not refreshed(job).heartbeats_missing
    fleet.wait("a committed checkpoint", lambda: job.checkpoints.filter(
        state__in=("committed", "verified")).exists(), job=job)
    kill_a_node(fleet, cluster, first)

    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    # The survivor handed over the step it completed, with no code of the
    # script's own: at most the step in flight is redone, not the steps
    # since the last periodic checkpoint.
    handover = job.events.get(kind="TrainerSurvivorHandover")
    assert second.resume_step == handover.evidence["step"] > 25
    assert refreshed(first).last_step - second.resume_step <= 1
    fleet.wait("the job succeeded", lambda: refreshed(job).phase == Phase.SUCCEEDED, job=job,
               timeout=200)
    assert refreshed(job).current_step == 300
    artifact = ModelArtifact.objects.get(job=job)
    assert artifact.checkpoint.step == 300 and artifact.format == "torch"

    # Killed, resumed on another node, and still bitwise the run that never stopped.
    resumed = download_model(api, django_user_model, job)
    plain = uninterrupted(tmp_path, "train_ddp_sdk.py", steps=300)
    assert resumed.keys() == plain.keys()
    assert all(torch.equal(resumed[k], plain[k]) for k in plain)


@pytest.mark.timeout(360)
def test_the_fsdp_script_resumes_from_its_newest_checkpoint_and_its_model_downloads(
        fleet, api, django_user_model):
    cluster = fleet.cluster()
    job = submit_program(fleet, cluster, "train_fsdp_sdk.py",
                         strategy=TrainingJob.Strategy.FSDP, steps=120, sleep=0.1)

    fleet.wait("a committed checkpoint", lambda: job.checkpoints.filter(
        state__in=Checkpoint.LOADABLE).exists(), job=job, timeout=150)
    first = fleet.wait("attempt 1 past step 30", running(job, 1, 30), job=job)
    killed = kill_a_node(fleet, cluster, first)

    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    newest = max(job.checkpoints.filter(attempt=first, state__in=Checkpoint.LOADABLE)
                 .values_list("step", flat=True))
    assert second.resume_step == newest and newest % 20 == 0
    # FSDP's shards died with their node: the timeline says why it rolled back.
    refused = job.events.filter(kind="TrainerSurvivorHandoverFailed").first()
    assert refused is not None and "sharded (FSDP)" in refused.message
    fleet.wait("the killed node replaced",
               lambda: refreshed(killed).state == Node.State.REPLACED, job=job, timeout=30)
    assert killed.name not in set(second.placements.values_list("node__name", flat=True))
    fleet.wait("the job succeeded", lambda: refreshed(job).phase == Phase.SUCCEEDED, job=job,
               timeout=200)

    # Steps redone: only those past the newest checkpoint, at most one interval
    # (plus the few steps an async save takes to commit after its step).
    reached = max(MetricPoint.objects.filter(attempt=first, name="loss")
                  .values_list("step", flat=True))
    assert 0 <= reached - second.resume_step <= 20 + 5
    steps_after = MetricPoint.objects.filter(attempt=second, name="loss") \
        .values_list("step", flat=True)
    assert min(steps_after) == second.resume_step + 1 and max(steps_after) == 120
    assert refreshed(job).current_step == 120
    model = download_model(api, django_user_model, job)
    assert model["blocks.0.ff.0.weight"].shape == (256, 64)  # gathered whole, not a shard
    assert model["head.weight"].shape == (1, 64)
