from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Greatest
from django.utils import timezone
from rest_framework import status
from rest_framework.response import Response

from clusters.models import Node
from controlplane.lib.tasks import enqueue_on_commit

from .. import tasks
from ..models import JobAttempt, RankStatus, TrainingJob
from . import worker_schema
from .worker_base import WorkerView

PROGRESS_KEYS = ("samples_per_s", "tokens_per_s", "step_time_s")
# A node's "last heartbeat" is written at most this often: its ranks all
# beat every few seconds, and the node page reads it in seconds too.
NODE_HEARTBEAT_EVERY = timedelta(seconds=5)


class HeartbeatView(WorkerView):
    """A rank is alive at `step`. The reply carries the attempt's directives."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        # Every 403 here carries `stop`, as the schema says: true only for an
        # attempt that has ended (the post below); a caller that is not this
        # attempt's worker is told nothing about the attempt.
        if response.status_code == status.HTTP_403_FORBIDDEN and isinstance(response.data, dict):
            response.data.setdefault("stop", False)
        return response

    @worker_schema.heartbeat
    def post(self, request, attempt_id):
        attempt = self.attempt
        if attempt.state in JobAttempt.ENDED:
            return Response({"detail": f"attempt {attempt.pk} has ended ({attempt.state}).",
                             "stop": True}, status=status.HTTP_403_FORBIDDEN)
        f = self.fields(("rank", "node", "step", "gpu", *PROGRESS_KEYS))
        rank = f.int("rank", maximum=65535)
        step = f.int("step")
        node = f.str("node", max_length=253)
        rates = {key: f.number(key, minimum=0) for key in PROGRESS_KEYS}
        gpu = f.data.get("gpu")
        if gpu is not None and not isinstance(gpu, dict):
            f.errors["gpu"] = ["A JSON object or null is required."]
        f.check()
        now = timezone.now()
        with transaction.atomic():
            RankStatus.objects.bulk_create(
                [RankStatus(attempt=attempt, rank=rank, node_name=node, step=step, gpu=gpu,
                            last_heartbeat_at=now, **rates)],
                update_conflicts=True, unique_fields=["attempt", "rank"],
                update_fields=["node_name", "step", "gpu", "last_heartbeat_at", *PROGRESS_KEYS],
            )
            JobAttempt.objects.filter(pk=attempt.pk).update(
                last_heartbeat_at=now, last_step=Greatest("last_step", step)
            )
            _node_heard(attempt, node, now)
            # The auth lookup loaded the attempt: skip the write once a first step is known.
            first_step = step >= 1 and attempt.first_step_at is None and JobAttempt.objects.filter(
                pk=attempt.pk, first_step_at__isnull=True
            ).update(first_step_at=now)
            if rank == 0:
                progress = {"step": step, "attempt": attempt.pk, "at": now.isoformat(), **rates}
                TrainingJob.objects.filter(pk=attempt.job_id, current_step__lte=step).update(
                    current_step=step, progress=progress
                )
            if first_step:
                # The fast path: the reconciler marks the job running now, not at its next sweep.
                enqueue_on_commit(tasks.reconcile_job, attempt.job_id)
        return Response({"directives": attempt.directives()})


def _node_heard(attempt, node_name: str, now) -> None:
    """The node a rank runs on was heard from (Node.last_heartbeat_at, on
    the node page and the API): only a node placed in this attempt, so a
    worker cannot vouch for nodes it does not run on."""
    if not node_name:
        return
    Node.objects.filter(placements__attempt=attempt, name=node_name).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=now - NODE_HEARTBEAT_EVERY)
    ).update(last_heartbeat_at=now)
