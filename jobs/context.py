"""What every part of the job reconciler needs: the job's cluster, pool,
provider, its live attempt, and the cluster's typed settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from django.db import transaction

from clusters.providers import get_provider, pool_info
from jobs.admission import request_admission
from jobs.models import JobAttempt, TrainingJob


@dataclass
class Ctx:
    job: TrainingJob
    now: object

    @cached_property
    def cluster(self):
        return self.job.cluster

    @property
    def config(self):
        """The cluster's typed settings (clusters/settings.py)."""
        return self.cluster.config

    @cached_property
    def provider(self):
        return get_provider(self.cluster)

    @property
    def pool(self):
        return self.job.pool or self.cluster.pools.order_by("name").first()

    @property
    def pool_info(self):
        return pool_info(self.pool)

    def live_attempt(self) -> JobAttempt | None:
        return (
            JobAttempt.objects.filter(job=self.job).exclude(state__in=JobAttempt.ENDED)
            .order_by("-number").first()
        )

    def last_attempt(self) -> JobAttempt | None:
        return JobAttempt.objects.filter(job=self.job).order_by("-number").first()

    # The reconciler's own notes live in job.conditions (status it alone
    # writes), one dict per "type"; job.progress belongs to the heartbeats.
    def condition(self, kind: str) -> dict | None:
        return next((c for c in self.job.conditions or [] if c.get("type") == kind), None)

    def set_condition(self, kind: str, **fields) -> None:
        rest = [c for c in self.job.conditions or [] if c.get("type") != kind]
        if fields:
            rest.append({"type": kind, **fields})
        TrainingJob.objects.filter(pk=self.job.pk).update(conditions=rest)
        self.job.conditions = rest

    def clear_condition(self, kind: str) -> None:
        if self.condition(kind) is not None:
            self.set_condition(kind)

    def release_nodes(self, target: str, attempt: JobAttempt | None, **transition) -> None:
        """Move the job to `target`, a phase that holds no nodes (ended, or
        queued again after a preemption), and record its nodes free, in one
        transaction: no reader sees the job moved without the release on
        its timeline, and a worker that dies between the two leaves neither.
        An admission pass for the freed GPUs follows the commit."""
        nodes = list(attempt.placements.values_list("node__name", flat=True)) if attempt else []
        with transaction.atomic():
            self.job.transition(target, attempt=attempt, now=self.now, **transition)
            self.job.record("NodesReleased",
                            "the job's nodes are free" if nodes else "no nodes held",
                            attempt=attempt, now=self.now, evidence={"nodes": nodes})
            request_admission(self.cluster.id)
