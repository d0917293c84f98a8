"""What every part of the job reconciler needs: the job's cluster, pool,
provider, its live attempt, and the cluster's typed settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from clusters.providers import get_provider, pool_info
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
