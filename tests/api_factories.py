"""Rows the API tests need beyond the shared personas: jobs, attempts with
real worker tokens, checkpoints."""

from rest_framework.test import APIClient

from checkpoints.models import Checkpoint
from jobs.models import JobAttempt, TrainingJob
from jobs.worker_api.tokens import issue as issue_token


def make_job(team, cluster, user=None, **fields) -> TrainingJob:
    spec = {"name": "train-gpt", "num_nodes": 1, "gpus_per_node": 2,
            "pool": cluster.pools.order_by("name").first(), **fields}
    return TrainingJob.objects.create(team=team, cluster=cluster, created_by=user, **spec)


def make_attempt(job, state=JobAttempt.State.RUNNING, number=None) -> tuple[JobAttempt, str]:
    number = number or job.attempts.count() + 1
    attempt = JobAttempt.objects.create(job=job, number=number, state=state)
    return attempt, issue_token(attempt)


def make_checkpoint(job, step, state=Checkpoint.State.COMMITTED, attempt=None) -> Checkpoint:
    return Checkpoint.objects.create(job=job, step=step, uri=f"/tmp/ckpt/step-{step}",
                                     state=state, attempt=attempt)


def worker_client(raw_token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_token}")
    return client
