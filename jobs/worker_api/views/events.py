import re

from django.db import transaction
from rest_framework.response import Response

from controlplane.lib.tasks import RECONCILE_JOB
from jobs.models import RankStatus
from jobs.worker_api.views import schema as worker_schema
from jobs.worker_api.views.base import WorkerView

KIND = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
# Events after which the job should be looked at now, not at the next sweep.
URGENT = {"finished", "crashed", "emergency_checkpoint", "preempted"}


def event_kind(kind: str) -> str:
    return "Trainer" + "".join(part.capitalize() for part in kind.split("_"))


class EventView(WorkerView):
    """A trainer event (started, resumed, crashed, ...) onto the job's timeline."""

    @worker_schema.events
    def post(self, request, attempt_id):
        f = self.fields(("kind", "rank", "message", "data", "node"))
        kind = f.str("kind", required=True, max_length=41)
        rank = f.int("rank", required=False, default=0, maximum=65535)
        message = f.str("message", max_length=10_000)
        data = f.dict("data")
        node = f.str("node", max_length=253)
        if "kind" not in f.errors and not KIND.match(kind):
            f.errors["kind"] = ["A snake_case event kind is required, e.g. started."]
        f.check()
        attempt = self.attempt
        if not node:
            node = (RankStatus.objects.filter(attempt=attempt, rank=rank)
                    .values_list("node_name", flat=True).first()) or "?"
        with transaction.atomic():
            event = attempt.job.record(
                event_kind(kind), message, actor=f"worker:rank{rank}@{node}", evidence=data,
                attempt=attempt,
            )
            if kind in URGENT:
                RECONCILE_JOB.soon(attempt.job_id)
        return Response({"event": event.pk}, status=201)
