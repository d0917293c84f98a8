"""Rows the pages show: a job with attempts, metrics, checkpoints, goodput."""

from datetime import timedelta

from django.utils import timezone

from checkpoints.models import Checkpoint
from clusters.models import Node, NodeHealthEvent
from jobs.goodput.models import GoodputEntry
from jobs.metrics import ingest
from jobs.models import AttemptNode, JobAttempt, Phase, TrainingJob


def make_job(team, cluster, user=None, **spec) -> TrainingJob:
    fields = {
        "name": "gpt-tiny", "num_nodes": 2, "gpus_per_node": 2,
        "hyperparameters": {"model": "nano", "max_steps": 400},
        "pool": cluster.pools.first(), "created_by": user,
    }
    fields.update(spec)
    return TrainingJob.objects.create(team=team, cluster=cluster, **fields)


def run(job: TrainingJob, nodes, *, number=1, resume_step=None, state="running",
        now=None) -> JobAttempt:
    """An attempt on `nodes`, moving the job to running through its transitions."""
    now = now or timezone.now()
    attempt = JobAttempt.objects.create(
        job=job, number=number, state=state, resume_step=resume_step, started_at=now,
        preflight={"ok": True, "allreduce_gbps": 1.73, "seconds": 0.8},
    )
    for rank, node in enumerate(nodes):
        AttemptNode.objects.create(attempt=attempt, node=node, node_rank=rank)
    if job.phase == Phase.PENDING:
        job.transition(Phase.QUEUED, reason="Queued", now=now)
    if job.phase == Phase.QUEUED:
        job.transition(Phase.ADMITTED, reason="Admitted", now=now)
    if job.phase in (Phase.ADMITTED, Phase.RESTARTING):
        job.transition(Phase.STARTING, reason="Launched", attempt=attempt, now=now)
    if job.phase == Phase.STARTING:
        job.transition(Phase.RUNNING, reason="Running", attempt=attempt, now=now)
    return attempt


def metrics(job, attempt, name, steps, value=lambda s: 4.0 / (1 + s / 50)):
    """Points stored as the worker endpoint stores them (jobs/metrics/ingest.py),
    with the names table and the rollups the charts read."""
    now = timezone.now().timestamp()
    rows = [(0, name, s, value(s), now) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))


def checkpoint(job, attempt, step, state=Checkpoint.State.VERIFIED, **kw) -> Checkpoint:
    return Checkpoint.objects.create(
        job=job, attempt=attempt, step=step, uri=f"file:///ckpt/job-{job.pk}/step-{step}",
        bytes=12_345_678, save_seconds=1.8, blocking_seconds=0.05, state=state, **kw,
    )


def goodput(job, attempt, category, gpu_hours, key):
    return GoodputEntry.objects.create(
        job=job, attempt=attempt, category=category, seconds=gpu_hours * 3600 / job.world_size,
        gpu_seconds=gpu_hours * 3600, key=key,
    )


def xid(node: Node, handled=False) -> NodeHealthEvent:
    return NodeHealthEvent.objects.create(
        node=node, kind=NodeHealthEvent.Kind.XID, severity=NodeHealthEvent.Severity.CRITICAL,
        message="XID 79: GPU has fallen off the bus", evidence={"xid": 79, "gpu": 0},
        handled_at=timezone.now() - timedelta(seconds=5) if handled else None,
    )


def rich_job(team, cluster, user=None, points=400):
    """A job that failed over once: two attempts, metrics in both, checkpoints,
    a goodput ledger, and the node it lost cordoned with an XID on record."""
    nodes = list(cluster.nodes.filter(is_spare=False).order_by("name"))
    job = make_job(team, cluster, user, hyperparameters={"model": "nano", "max_steps": points})
    first = run(job, nodes[:2], number=1)
    half = points // 2
    metrics(job, first, "loss", range(1, half + 20))
    metrics(job, first, "tokens_per_s", range(1, half + 20), value=lambda s: 5000 + s % 7)
    for step in range(50, half + 1, 50):
        checkpoint(job, first, step)
    lost = nodes[1]
    xid(lost, handled=True)
    lost.cordon("XID 79 on gpu 0", evidence={"xid": 79})
    JobAttempt.objects.filter(pk=first.pk).update(
        state=JobAttempt.State.FAILED, exit_code=-9, failure_class="hardware",
        failure_reason="node lost: XID 79", ended_at=timezone.now(),
    )
    job.transition(Phase.RESTARTING, reason="NodeFailed", message="rank 1 lost",
                   evidence={"node": lost.name, "xid": 79}, attempt=first)
    second = run(job, [nodes[0], nodes[2]], number=2, resume_step=half)
    metrics(job, second, "loss", range(half, points // 4 * 3))
    metrics(job, second, "val_loss", range(half, points // 4 * 3, 25), value=lambda s: 3.0)
    metrics(job, second, "tokens_per_s", range(half, points // 4 * 3), value=lambda s: 4800.0)
    goodput(job, first, GoodputEntry.Category.PRODUCTIVE, 1.5, "p1")
    goodput(job, first, GoodputEntry.Category.ROLLBACK, 0.1, "rb1")
    goodput(job, second, GoodputEntry.Category.RESTART, 0.05, "rs1")
    goodput(job, second, GoodputEntry.Category.CHECKPOINT, 0.02, "c1")
    TrainingJob.objects.filter(pk=job.pk).update(current_step=points // 4 * 3 - 1,
                                                 progress={"tokens_per_s": 4800.0})
    job.refresh_from_db()
    return job
