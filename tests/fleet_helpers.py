"""Helpers for the fleet tests: a cluster on the in-memory provider, and
real checkpoint folders (DCP shards, manifest, commit marker) written the way
the trainer writes them, so verification and export run for real."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from django.utils import timezone

from checkpoints.models import Checkpoint
from clusters.models import Cluster, Node, NodePool
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.admission import admit
from jobs.checkpointing import job_checkpoint_uri
from jobs.models import JobAttempt, Phase, Quota, RankStatus, Team, TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from tests.support import memory_provider as memory


def memory_cluster(name="mem-a", size=4, spares=1, gpus_per_node=2, **settings) -> Cluster:
    cluster = Cluster.objects.create(
        name=name, provider=memory.KIND,
        settings={"observe_interval_s": 1.0, "heartbeat_deadline_s": 30.0, **settings},
    )
    pool = NodePool.objects.create(cluster=cluster, name="gpu", gpus_per_node=gpus_per_node,
                                   size=size, spare_count=spares)
    provider = memory.MemoryProvider(cluster.name)
    provider.add_nodes(pool_info(pool), size + spares)
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    return cluster


def provider_of(cluster) -> memory.MemoryProvider:
    return memory.MemoryProvider(cluster.name)


def report_not_ready(cluster, node: Node) -> None:
    """The provider reports the node not ready (and says nothing more): the
    node's own evidence that ranks killed on it died with it."""
    info = pool_info(node.pool)
    with memory._LOCK:
        nodes = provider_of(cluster).fleet.nodes[(info.cluster, info.name)]
        nodes[node.name] = replace(nodes[node.name], ready=False)


def lose_node(cluster, node: Node, ref: dict | None = None) -> None:
    """A node dies whole, as the local provider's "kill" fault leaves it: the
    provider reports it not ready and sends a "lost" signal, and the part of
    the attempt on it (if any) was killed."""
    provider = provider_of(cluster)
    info = pool_info(node.pool)
    report_not_ready(cluster, node)
    provider.signal(info, node.name, "lost", message="node lost: every process on it was killed",
                    evidence={"fault": "kill"})
    if ref is not None:
        provider.exit_node(ref, node.name, signal=9, log_tail="Killed")


def team_with_quota(cluster, name="vision", gpus=8, **kw) -> Team:
    team, _ = Team.objects.get_or_create(name=name)
    Quota.objects.create(team=team, cluster=cluster, gpus=gpus, **kw)
    return team


def submit(cluster, team, name="train", nodes=2, gpus=2, **kw) -> TrainingJob:
    kw.setdefault("hyperparameters", {"model": "nano", "max_steps": 20})
    return TrainingJob.objects.create(name=name, team=team, cluster=cluster, num_nodes=nodes,
                                      gpus_per_node=gpus, **kw)


# The DCP shards and exported model of one weight tensor, saved once per
# test process and copied into each checkpoint folder that holds it: a DCP
# save costs tens of milliseconds, a copy of its small files far less, and
# the folder's bytes are the same either way (DCP folders are relocatable).
_STATES: dict[tuple, Path] = {}


def _saved_state(w: torch.Tensor) -> Path:
    key = (str(w.dtype), tuple(w.shape), w.numpy().tobytes())
    if key not in _STATES:
        root = Path(tempfile.mkdtemp(prefix="regatta-ckpt-state-"))
        atexit.register(shutil.rmtree, root, True)
        dcp.save({"model": {"w": w}, "optim": {"lr": torch.tensor(0.1)}}, checkpoint_id=str(root))
        (root / "config.json").write_text(json.dumps({"model": "nano"}))
        # The consolidated model the trainer leaves in a final checkpoint.
        (root / "export").mkdir()
        torch.save({"w": w}, root / "export" / "model.pt")
        (root / "export" / "config.json").write_text(json.dumps({"model": "nano"}))
        _STATES[key] = root
    return _STATES[key]


def write_checkpoint(job, step, attempt=None, *, blocking_s=0.05, request_id="",
                     emergency=False, created_at=None, weight=None) -> Checkpoint:
    """A committed step-N folder (real DCP save of a tiny model) and its row,
    as the trainer and the worker API would leave them."""
    from regatta import manifest as mf

    root = Path(job_checkpoint_uri(job)) / f"step-{step}"
    w = weight if weight is not None else torch.full((2, 2), float(step))
    shutil.copytree(_saved_state(w), root, dirs_exist_ok=True)
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    manifest = mf.build_manifest(step, mf.hash_local_files(root, rels))
    (root / mf.MANIFEST).write_bytes(manifest)
    (root / mf.MARKER).write_bytes(mf.marker_for(manifest))
    return Checkpoint.objects.create(
        job=job, attempt=attempt, step=step, uri=f"file://{root}", bytes=1,
        manifest_sha256=mf.sha256_bytes(manifest), blocking_seconds=blocking_s,
        save_seconds=blocking_s * 4, request_id=request_id, emergency=emergency,
        created_at=created_at or timezone.now(),
    )


def heartbeat(attempt: JobAttempt, step: int, at, *, ranks=None, step_time_s=0.2) -> None:
    """What the worker heartbeat endpoint records for each rank."""
    job = attempt.job
    placements = {p.node_rank: p.node.name for p in attempt.placements.select_related("node")}
    for rank in ranks if ranks is not None else range(job.world_size):
        RankStatus.objects.update_or_create(
            attempt=attempt, rank=rank,
            defaults={"node_name": placements[rank // job.gpus_per_node], "step": step,
                      "step_time_s": step_time_s, "last_heartbeat_at": at},
        )
    JobAttempt.objects.filter(pk=attempt.pk).update(
        last_heartbeat_at=at, last_step=step,
    )
    JobAttempt.objects.filter(pk=attempt.pk, first_step_at=None).update(first_step_at=at)


def launch(job, now) -> None:
    """A submitted job's way to its first launch: its reconcile queues it, the
    cluster's admission pass admits it, its next reconcile launches it."""
    reconcile_job_unlocked(job.id, now)
    admit(job.cluster_id, now)
    reconcile_job_unlocked(job.id, now)


def running_job(cluster, team, now, **spec):
    """A job submitted, launched and heard from once: running on the memory
    fleet, ready for a fault."""
    job = submit(cluster, team, **spec)
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 5, later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    return job, attempt


def later(now, seconds):
    return now + timedelta(seconds=seconds)


def nodes_of(attempt) -> list[Node]:
    return [p.node for p in attempt.placements.select_related("node").order_by("node_rank")]


def kinds(job) -> list[str]:
    return list(job.events.values_list("kind", flat=True))
