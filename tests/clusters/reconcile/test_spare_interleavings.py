"""Spare accounting under random interleavings: a seeded scheduler picks,
step after step, a cluster pass, a job pass, an admission pass, a provider's
report or a fault (a node lost, a rank killed, a notice, an XID, a cordon),
and the pool's invariants (spare_invariants.py) are checked after every
step. A failing seed is printed with the steps that led to it, and replays
the same way (the order is all the randomness: the fleet is the in-memory
provider, the clock a parameter)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Node
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.admission import admit
from jobs.models import TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    lose_node,
    memory_cluster,
    provider_of,
    submit,
    team_with_quota,
)
from tests.support import memory_provider as memory

from .spare_invariants import PoolWatch

SIZE, SPARES = 4, 2
SEEDS = range(12)
STEPS = 40


class Fleet:
    """One pool, one team, a job at a time, and the operations the
    scheduler interleaves."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.cluster = memory_cluster(size=SIZE, spares=SPARES)
        self.pool = self.cluster.pools.get()
        self.info = pool_info(self.pool)
        self.team = team_with_quota(self.cluster)
        self.now = timezone.now()
        self.jobs = 0
        self.job = self._submit()

    def _submit(self) -> TrainingJob:
        self.jobs += 1
        return submit(self.cluster, self.team, name=f"train-{self.jobs}",
                      restart_budgets={"hardware": 100, "preempted": 100, "hang": 100,
                                       "transient": 100, "process": 100},
                      hyperparameters={"model": "nano", "max_steps": 100_000})

    def _node(self, *, spare: bool | None = None) -> Node | None:
        nodes = Node.objects.filter(pool=self.pool).exclude(state__in=Node.RETIRED)
        if spare is not None:
            nodes = nodes.filter(is_spare=spare)
        nodes = list(nodes.order_by("name"))
        return self.rng.choice(nodes) if nodes else None

    def _live_attempt(self):
        self.job.refresh_from_db()
        return self.job.attempts.filter(ended_at__isnull=True).order_by("-number").first()

    # --- the operations ----------------------------------------------------
    def cluster_pass(self) -> str:
        reconcile_cluster_unlocked(self.cluster.id, self.now)
        return "cluster pass"

    def job_pass(self) -> str:
        attempt = self._live_attempt()
        if attempt is not None and attempt.provider_ref:
            heartbeat(attempt, 1, self.now)  # a live gang reports: no hang from the clock
        reconcile_job_unlocked(self.job.id, self.now)
        self.job.refresh_from_db()
        if self.job.is_terminal:
            self.job = self._submit()
            return "job pass (the job ended; another submitted)"
        return "job pass"

    def admission(self) -> str:
        admit(self.cluster.id, self.now)
        return "admission pass"

    def kill(self) -> str:
        """A node dies whole: the provider reports it not ready and lost."""
        node = self._node()
        if node is None:
            return "kill: no node"
        attempt = self._live_attempt()
        ref = None
        if attempt is not None and attempt.provider_ref and attempt.placements.filter(
                node=node).exists():
            ref = attempt.provider_ref
        lose_node(self.cluster, node, ref)
        return f"kill {node.name}{' (under the job)' if ref else ''}"

    def kill_rank(self) -> str:
        """One rank of the job dies on a healthy node (relaunched in place)."""
        attempt = self._live_attempt()
        if attempt is None or not attempt.provider_ref:
            return "kill a rank: no gang"
        node = self.rng.choice([p.node for p in attempt.placements.select_related("node")])
        provider_of(self.cluster).exit_node(attempt.provider_ref, node.name, signal=9)
        return f"kill a rank on {node.name}"

    def report_not_ready(self) -> str:
        """The provider reports a node not ready, with no signal."""
        node = self._node()
        if node is None:
            return "report: no node"
        with memory._LOCK:
            nodes = provider_of(self.cluster).fleet.nodes[(self.info.cluster, self.info.name)]
            if node.name in nodes:
                nodes[node.name] = replace(nodes[node.name], ready=False)
        return f"provider reports {node.name} not ready"

    def spot_notice(self) -> str:
        node = self._node(spare=self.rng.random() < 0.5)
        if node is None:
            return "spot notice: no node"
        provider_of(self.cluster).signal(
            self.info, node.name, "spot_notice", severity="warning",
            evidence={"action": "terminate",
                      "time": (self.now + timedelta(seconds=120)).timestamp()},
            key=f"spot-{node.name}-{self.now.timestamp()}")
        return f"spot notice on {node.name}{' (spare)' if node.is_spare else ''}"

    def xid(self) -> str:
        node = self._node()
        if node is None:
            return "xid: no node"
        provider_of(self.cluster).signal(self.info, node.name, "xid", message="XID 79",
                                         key=f"xid-{node.name}-{self.now.timestamp()}")
        return f"xid on {node.name}{' (spare)' if node.is_spare else ''}"

    def operator_cordon(self) -> str:
        node = self._node()
        if node is None or node.state not in ("ready", "provisioning"):
            return "cordon: no ready node"
        node.cordon("operator: maintenance", now=self.now)
        return f"operator cordons {node.name}"

    def operator_uncordon(self) -> str:
        node = (Node.objects.filter(pool=self.pool, state="cordoned")
                .order_by("name").first())
        if node is None:
            return "uncordon: none cordoned"
        node.uncordon("operator: maintenance done", now=self.now)
        return f"operator uncordons {node.name}"

    OPERATIONS = {
        cluster_pass: 6, job_pass: 6, admission: 2, kill: 2, kill_rank: 1, report_not_ready: 1,
        spot_notice: 2, xid: 1, operator_cordon: 1, operator_uncordon: 1,
    }

    def step(self) -> str:
        self.now += timedelta(seconds=self.rng.choice((0.5, 1, 2)))
        ops, weights = zip(*self.OPERATIONS.items(), strict=True)
        return self.rng.choices(ops, weights)[0](self)


@pytest.mark.usefixtures("fleet_dirs")
@pytest.mark.parametrize("seed", SEEDS)
def test_random_interleavings_keep_the_spare_invariants(db, seed):
    rng = random.Random(seed)
    fleet = Fleet(rng)
    watch = PoolWatch(fleet.pool)
    watch.check("setup")
    done = []
    for _ in range(STEPS):
        done.append(fleet.step())
        try:
            watch.check(done[-1])
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, steps: {done}\n{exc}") from None
