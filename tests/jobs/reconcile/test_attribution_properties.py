"""The attribution rules as properties, under random failures: a seeded
scheduler picks, step after step, a failure of the program (the same
exception every time), a rank SIGKILLed with no sign from its node, a node
truly lost (not ready at the provider, its processes gone), an XID, a
provider that cannot be asked, a mend of a node taken out (its owner
resumes it at the provider), progress of the job, or a pass. After every
step:

- no node is out of service without node-level evidence: a health event
  of its own (lost, XID, a failed check) or the provider reporting it gone;
- a job whose failures are all its program's retires no node at all, and
  checks at most `max_nodes_retired_by_job` of them;
- the pool never runs over its size;

and once every taken-out node is mended, the pool is whole again.

The fleet is the in-memory provider with Slurm's way of replacing (the
machine stays, drained, for its owner to mend): the only place here a fake
stands in, since nothing else lets a property test run thousands of passes.
A failing seed prints the steps that led to it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Node, NodeHealthEvent
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
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

from .test_evidence import PEER_LOG, PROGRAM_LOG

SIZE, SPARES = 3, 2
SEEDS = range(10)
STEPS = 45

# Slow: twenty seeded runs of thousands of passes (a minute of CPU on
# PostgreSQL), a fuzzer rather than the inner loop's checks; `make test`
# runs them, `make test-fast` and CI's SQLite pass leave them out.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fleet_dirs")]


class World:
    def __init__(self, seed: int, program_only: bool):
        self.rng = random.Random(seed)
        self.program_only = program_only
        self.now = timezone.now()
        self.cluster = memory_cluster(size=SIZE, spares=SPARES, node_failure_grace_s=10,
                                      preflight=True, heartbeat_deadline_s=30.0,
                                      crash_loop_failures=1000)
        pool = self.cluster.pools.get()
        pool.settings = {"keeps_machines": True}
        pool.save()
        self.pool = pool
        self.provider = provider_of(self.cluster)
        self.job = submit(self.cluster, team_with_quota(self.cluster), nodes=2,
                          restart_budgets={c: 1000 for c in (
                              "code", "transient", "hardware", "preempted", "hang", "process")})
        # The step at which the fleet itself last gave evidence against each
        # node, and, per node, the step and the newest health event id when
        # a check first saw it back in service (evidence must come after).
        self.evidence: dict[str, int] = {}
        self.last_ready: dict[str, tuple[int, int]] = {}
        self.seen_out: set[str] = set()
        self.step_index = 0
        self.step_no = 5
        self.log: list[str] = []

    def tick(self, seconds: float = 2.0):
        self.now += timedelta(seconds=seconds)

    def attempt(self):
        return self.job.attempts.exclude(state__in=("succeeded", "failed", "stopped")) \
            .order_by("-number").first()

    def running_nodes(self):
        attempt = self.attempt()
        if attempt is None or not attempt.provider_ref:
            return attempt, []
        return attempt, [p.node for p in attempt.placements.select_related("node")]

    # --- the steps --------------------------------------------------------
    def job_pass(self):
        reconcile_job_unlocked(self.job.id, self.now)

    def cluster_pass(self):
        reconcile_cluster_unlocked(self.cluster.id, self.now)
        from jobs.admission import admit
        admit(self.cluster.id, self.now)

    def progress(self):
        attempt, nodes = self.running_nodes()
        if nodes and attempt.state in ("starting", "running"):
            self.step_no += self.rng.choice((1, 50))
            heartbeat(attempt, self.step_no, self.now)

    def program_fails(self):
        attempt, nodes = self.running_nodes()
        if len(nodes) < 2:
            return
        first, second = self.rng.sample(nodes, 2)
        self.provider.exit_node(attempt.provider_ref, first.name, exit_code=1,
                                log_tail=PROGRAM_LOG)
        self.provider.exit_node(attempt.provider_ref, second.name, exit_code=1,
                                log_tail=PEER_LOG)

    def rank_killed(self):
        attempt, nodes = self.running_nodes()
        if nodes:
            victim = self.rng.choice(nodes)
            self.provider.exit_node(attempt.provider_ref, victim.name, signal=9,
                                    log_tail="exitcode : -9 (pid 4242) Signal 9 (SIGKILL)")

    def node_lost(self):
        attempt, nodes = self.running_nodes()
        pool_nodes = list(Node.objects.filter(pool=self.pool, state="ready"))
        victim = self.rng.choice(nodes or pool_nodes) if (nodes or pool_nodes) else None
        if victim is None:
            return
        self.evidence[victim.name] = self.step_index
        lose_node(self.cluster, victim, attempt.provider_ref if victim in nodes else None)

    def xid(self):
        candidates = list(Node.objects.filter(pool=self.pool, state="ready"))
        if candidates:
            victim = self.rng.choice(candidates)
            self.evidence[victim.name] = self.step_index
            self.provider.signal(pool_info(self.pool), victim.name, "xid",
                                 message="XID 79: GPU has fallen off the bus")

    def stalled_provider_pass(self):
        original = memory.MemoryProvider.list_nodes

        def stalled(provider, pool):
            from controlplane.lib.errors import TemporaryError
            raise TemporaryError("the scheduler does not answer", delay=5.0)

        memory.MemoryProvider.list_nodes = stalled
        try:
            self.job_pass()
        finally:
            memory.MemoryProvider.list_nodes = original

    def mend(self):
        """An owner mends a node that was taken out: ready and resumed at
        the provider (Regatta's drain lifted)."""
        out = list(Node.objects.filter(pool=self.pool, state__in=("failed", "replaced")))
        if not out:
            return
        node = self.rng.choice(out)
        self.mend_node(node)

    def mend_node(self, node):
        info = pool_info(self.pool)
        with memory._LOCK:
            nodes = self.provider.fleet.nodes[(info.cluster, info.name)]
            if node.name in nodes:
                nodes[node.name] = replace(nodes[node.name], ready=True, unschedulable=False)

    # --- the invariants ------------------------------------------------------
    def check(self, where: str):
        newest = NodeHealthEvent.objects.order_by("-id").values_list("id", flat=True).first()
        for name in Node.objects.filter(pool=self.pool, state="ready").values_list("name",
                                                                                 flat=True):
            if name in self.seen_out:  # back in service since the last check
                self.seen_out.discard(name)
                self.last_ready[name] = (self.step_index, newest or 0)
        out = Node.objects.filter(pool=self.pool, state__in=("failed", "replaced", "cordoned"))
        self.seen_out |= {node.name for node in out}
        for node in out:
            # Evidence since the node was last in service (a mended node
            # taken out again needs evidence of its own).
            step, event_id = self.last_ready.get(node.name, (-1, 0))
            evidence = (NodeHealthEvent.objects.filter(
                node=node, severity="critical", id__gt=event_id).exists()
                or self.evidence.get(node.name, -2) >= step)
            assert evidence, f"{where}: {node.name} is {node.state} with no evidence " \
                             f"({node.state_reason})\n" + "\n".join(self.log)
        working = Node.objects.filter(pool=self.pool, is_spare=False,
                                      state__in=Node.WORKING).count()
        assert working <= SIZE, f"{where}: {working} working nodes\n" + "\n".join(self.log)
        if self.program_only:
            retired = list((self.job.restart_marks or {}).get("retired_by_job") or [])
            assert not Node.objects.filter(pool=self.pool).exclude(state="ready").exists(), (
                f"{where}: a program's failures took a node out\n" + "\n".join(self.log))
            assert not retired

    def run(self, steps: int):
        choices = [self.job_pass, self.cluster_pass, self.progress, self.program_fails,
                   self.rank_killed, self.stalled_provider_pass]
        if not self.program_only:
            choices += [self.node_lost, self.xid, self.mend, self.cluster_pass]
        from tests.fleet_helpers import launch
        launch(self.job, self.now)
        for i in range(steps):
            self.step_index = i
            step = self.rng.choice(choices)
            self.tick(self.rng.choice((1, 2, 12)))
            self.log.append(f"{i}: {step.__name__} at +{(self.now - timezone.now()).seconds}s")
            step()
            self.job.refresh_from_db()
            self.check(f"step {i} ({step.__name__})")
            if self.job.phase in (Phase.FAILED, Phase.SUCCEEDED):
                break


@pytest.mark.parametrize("seed", SEEDS)
def test_a_programs_own_failures_retire_no_node(db, seed):
    World(seed, program_only=True).run(STEPS)


@pytest.mark.parametrize("seed", SEEDS)
def test_no_node_leaves_without_evidence_and_every_mended_node_comes_back(db, seed):
    world = World(seed, program_only=False)
    world.run(STEPS)
    # The faults of the run settle first (every signal recorded and acted
    # on, Regatta's holds at the provider in place, the replacements
    # asked); then every machine is mended, and a few passes later the pool
    # is whole again.
    for _ in range(3):
        world.tick(12)
        world.cluster_pass()
        world.job_pass()
    for node in Node.objects.filter(pool=world.pool):
        world.mend_node(node)  # every machine fixed, whatever Regatta thinks of it yet
    for _ in range(12):
        world.tick(5)
        world.cluster_pass()
        world.job_pass()
        world.check("after the mends")
    ready = Node.objects.filter(pool=world.pool, state="ready")
    assert ready.filter(is_spare=False).count() == SIZE, "\n".join(world.log)
    stuck = Node.objects.filter(pool=world.pool, state__in=("failed", "replaced"))
    assert not stuck.exists(), "\n".join(
        [*world.log, *(f"{n.name} {n.state} held={n.provider_held} return="
                       f"{n.return_requested_at} replace={n.replace_requested_at}: "
                       + " | ".join(f"{e.to_state}: {e.reason}" for e in n.events.all())
                       for n in stuck)])
