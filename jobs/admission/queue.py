"""Admission: which queued jobs may take nodes now, and why the others wait.

One owner: the per-cluster admission task (jobs/tasks.py `admit_cluster`),
sent on commit whenever the queue or the capacity changes (a job queued or
back in the queue, a job's nodes released, a quota edited, the cluster's
working nodes changed: clusters/reconcile sends it by name) and swept by
beat. A queued job's own reconcile only reads the reason a pass left it.

Per cluster, jobs are considered by priority (high first) then submit time.
A gang is admitted whole or not at all, never past its team's GPU quota or
the healthy free nodes of its pool. The Cluster row and the teams' Quota rows
are locked (`select_for_update`) for the whole pass, so two workers admitting
at once queue on the lock instead of both spending the same GPUs; on SQLite
the IMMEDIATE transaction mode serialises writers the same way.

Blocking rules, so big gangs do not starve and one team cannot stall another:
- a job that waits only for its own team's quota blocks nobody;
- a job that waits for nodes blocks every lower job of the same pool.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, F, Q, Sum

from clusters.models import Cluster, Node, NodePool
from clusters.providers import get_provider
from clusters.providers.capabilities import WaitsForEnvironment
from clusters.providers.registry import provider_class
from controlplane.lib.tasks import (
    ADMIT_CLUSTER,
    RECONCILE_JOB,
    RECONCILE_JOBS,
)
from jobs import goodput
from jobs.admission import preemption, sharing
from jobs.goodput.models import GoodputEntry
from jobs.models import AttemptNode, JobAttempt, Phase, Quota, Team, TrainingJob

log = logging.getLogger(__name__)

# Admitted jobs woken per message (see _Pass.write_admissions).
WAKE_BATCH = 100


@dataclass
class AdmissionReport:
    admitted: list[int] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)


def queue_order(qs):
    # A preempted job goes first among its team's jobs of its priority.
    return qs.order_by("-priority", F("preempted_at").asc(nulls_last=True), "created_at", "id")


def busy_node_ids(cluster_id: int) -> set[int]:
    """Nodes that a live attempt occupies."""
    return set(
        AttemptNode.objects.filter(node__cluster_id=cluster_id)
        .exclude(attempt__state__in=JobAttempt.ENDED)
        .values_list("node_id", flat=True)
    )


def free_nodes_by_pool(cluster_id: int) -> dict[int, int]:
    """Healthy working nodes per pool that no job holds or has been promised.

    An admitted or restarting job without a live attempt has been promised
    `num_nodes` nodes of its pool, so they count as taken."""
    busy = busy_node_ids(cluster_id)
    free: dict[int, int] = defaultdict(int)
    for node_id, pool_id in Node.objects.filter(
        cluster_id=cluster_id, state=Node.State.READY, is_spare=False
    ).values_list("id", "pool_id"):
        if node_id not in busy:
            free[pool_id] += 1
    live_jobs = set(
        JobAttempt.objects.filter(job__cluster_id=cluster_id)
        .exclude(state__in=JobAttempt.ENDED)
        .values_list("job_id", flat=True)
    )
    for job_id, pool_id, nodes in TrainingJob.objects.filter(
        cluster_id=cluster_id, phase__in=TrainingJob.HOLDS_GPUS
    ).values_list("id", "pool_id", "num_nodes"):
        if job_id not in live_jobs:
            free[pool_id] -= nodes
    return free


def quota_usage(quotas) -> dict[int, dict]:
    """{quota id: GPUs and jobs its team holds on its cluster, against its
    limits, and the GPUs it borrows beyond its quota or lends out of it},
    for any number of quotas in three queries."""
    quotas = list(quotas)
    pairs = {(q.team_id, q.cluster_id) for q in quotas}
    holding = TrainingJob.objects.filter(cluster_id__in={c for _, c in pairs},
                                         phase__in=TrainingJob.HOLDS_GPUS)
    held = {(r["team_id"], r["cluster_id"]): r for r in (
        holding.filter(team_id__in={t for t, _ in pairs})
        .values("team_id", "cluster_id")
        # Eval runs count against the GPUs, not the running jobs (jobs/evals/).
        .annotate(gpus=Sum(F("num_nodes") * F("gpus_per_node")),
                  jobs=Count("id", filter=~Q(kind=TrainingJob.Kind.EVAL)),
                  borrowed=Sum("borrowed_gpus")))}
    lent: dict[tuple[int, int], int] = defaultdict(int)
    for cluster_id, borrowed_from in holding.filter(borrowed_gpus__gt=0).values_list(
            "cluster_id", "borrowed_from"):
        for lender, gpus in (borrowed_from or {}).items():
            lent[(int(lender), cluster_id)] += int(gpus)
    usage = {}
    for q in quotas:
        row = held.get((q.team_id, q.cluster_id)) or {}
        gpus, borrowed = row.get("gpus") or 0, row.get("borrowed") or 0
        lent_out = lent[(q.team_id, q.cluster_id)]
        usage[q.pk] = {"gpus_used": gpus, "gpus_limit": q.gpus,
                       "gpus_free": max(0, q.gpus - (gpus - borrowed) - lent_out),
                       "gpus_borrowed": borrowed, "gpus_lent": lent_out,
                       "running_jobs": row.get("jobs", 0),
                       "running_jobs_limit": q.max_running_jobs}
    return usage


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fleet_waiting(cluster: Cluster) -> str:
    """Why the cluster's fleet cannot run ranks yet, as its provider says
    (the WaitsForEnvironment capability: only the local provider has it), or ""."""
    if not issubclass(provider_class(cluster.provider), WaitsForEnvironment):
        return ""  # no provider is built for nothing in every pass
    return get_provider(cluster).environment_waiting()


def request_admission(cluster_id: int) -> None:
    """Ask for an admission pass of the cluster once the transaction commits."""
    ADMIT_CLUSTER.soon(cluster_id)


def jobs_on_nodes(node_ids) -> dict[int, list[int]]:
    """{node id: jobs with a live attempt on it}: what runs on the fleet, as
    clusters/workload.py asks it."""
    found: dict[int, list[int]] = defaultdict(list)
    rows = (AttemptNode.objects.filter(node_id__in=list(node_ids))
            .exclude(attempt__state__in=JobAttempt.ENDED)
            .values_list("node_id", "attempt__job_id").distinct())
    for node_id, job_id in rows:
        found[node_id].append(job_id)
    return dict(found)


def admit(cluster_id: int, now) -> AdmissionReport:
    """One admission pass over the cluster's queue; returns who got in."""
    report = AdmissionReport()
    with transaction.atomic():
        # FOR NO KEY UPDATE: passes and launches still queue on each other,
        # but a transaction that inserts a row pointing at the cluster (a new
        # job, an eval run, a node) takes only KEY SHARE for its foreign key
        # and need not wait for the pass: with FOR UPDATE, such a writer that
        # also held a queued job's row deadlocked with the pass.
        cluster = Cluster.objects.select_for_update(no_key=True).filter(pk=cluster_id).first()
        if cluster is None:
            return report
        # Locked for the pass: the admitted ones are moved in one statement
        # at its end, on the word of what was read here.
        queued = list(queue_order(TrainingJob.objects.select_for_update(of=("self",)).filter(
            cluster_id=cluster_id, phase=Phase.QUEUED, cancel_requested_at__isnull=True
        )))
        if not queued:
            return report
        # Every quota of the cluster: lenders' idle quota is read too.
        quotas = {q.team_id: q for q in Quota.objects.select_for_update()
                  .filter(cluster_id=cluster_id).order_by("id")}
        names = dict(Team.objects.filter(
            pk__in={*quotas, *(j.team_id for j in queued)}).values_list("id", "name"))
        fleet = sharing.load(cluster, queued, quotas, names)
        pass_ = _Pass(cluster, fleet, names, now)
        position = 0
        reasons: dict[int, str] = {}
        for job in sharing.admission_order(queued, fleet):
            reason = pass_.consider(job)
            if reason is None:
                report.admitted.append(job.id)
                continue
            position += 1
            reasons[job.id] = f"{reason}; position {position} in queue"
        pass_.write_admissions()
        goodput.book_queueing_many(pass_.queueing)
        _store_reasons(queued, reasons)
        report.waiting = reasons
    return report


class _Pass:
    """One pass's decisions, job by job, against the figures it keeps current."""

    def __init__(self, cluster, fleet: sharing.Fleet, names: dict, now):
        self.cluster, self.fleet, self.names, self.now = cluster, fleet, names, now
        self.pools = {p.id: p for p in NodePool.objects.filter(cluster_id=cluster.id)
                      .order_by("name")}
        self.default_pool = next(iter(self.pools.values()), None)
        self.free = free_nodes_by_pool(cluster.id)
        self.blocked_by: dict[int, TrainingJob] = {}
        # A fleet that cannot run ranks yet (the local fleet's torch still
        # installing) admits nothing: its jobs wait with that reason.
        self.fleet_waiting = fleet_waiting(cluster)
        self.queueing: list = []  # the admitted jobs' queueing spans, booked at the end
        self.admitted: list[tuple[TrainingJob, str, dict]] = []  # written at the end

    def consider(self, job: TrainingJob) -> str | None:
        """None: admitted; otherwise why it waits."""
        cluster, pool = self.cluster, self.pools.get(job.pool_id) or self.default_pool
        if pool is None:
            return f"cluster {cluster.name} has no node pool"
        if job.gpus_per_node > pool.gpus_per_node:
            return (f"needs {job.gpus_per_node} GPUs per node; pool {pool.name} nodes have "
                    f"{pool.gpus_per_node}")
        if self.fleet_waiting:
            return self.fleet_waiting
        team = self.fleet.teams[job.team_id]
        quota = team.quota
        if quota is None:
            return f"no quota on cluster {cluster.name}"
        # An eval run is part of a job that already counts (jobs/evals/).
        if not job.is_eval and team.jobs >= quota.max_running_jobs:
            return (f"team runs {team.jobs} jobs on cluster {cluster.name}; "
                    f"quota allows {quota.max_running_jobs}")
        blocker = self.blocked_by.get(pool.id)
        if blocker is not None:
            return f"waiting behind job #{blocker.id} ({blocker.name}) for pool {pool.name}"
        quota_short = max(0, job.world_size - team.quota_free)
        plan: dict[int, int] = {}
        if quota_short and quota.can_borrow:
            plan = self.fleet.borrow_plan(team, quota_short) or {}
        available = max(0, self.free.get(pool.id, 0))
        nodes_short = max(0, job.num_nodes - available)
        if (quota_short and not plan) or nodes_short:
            return self._wait(job, pool, team, quota_short if not plan else 0, nodes_short,
                              available)
        self._admit(job, pool, plan)
        return None

    def _wait(self, job, pool, team, quota_short, nodes_short, available) -> str:
        room = sharing.make_room(job, pool.id, self.fleet, quota_short, nodes_short)
        if room is not None:
            reason = self._room_reason(room)
            preemption.ask_victims(job, room, self.names, self.now,
                                   self.cluster.config.preemption_checkpoint_wait_s)
            preemption.nominate(job, room, reason, self.now)
            for victim in room.victims:
                victim.evicting_for = job.id
            if nodes_short:
                # The nodes being freed are this job's: nothing behind it takes them.
                self.blocked_by[pool.id] = job
            return reason
        if job.id in self.fleet.nominated:
            # Its victims went (cancelled, ended) and no others would do:
            # it is an ordinary waiter again.
            TrainingJob.objects.filter(pk=job.pk).update(
                conditions=preemption.clear_nomination(job))
            self.fleet.nominated.discard(job.id)
        if quota_short:
            reason = (f"needs {_plural(job.world_size, 'GPU')}; "
                      f"team quota has {team.quota_free} free")
            if team.quota.can_borrow:
                reason += f"; {_plural(self.fleet.idle_for(team), 'idle GPU')} to borrow"
            return reason
        self.blocked_by[pool.id] = job
        reason = (f"needs {_plural(job.num_nodes, 'node')}; "
                  f"{_plural(available, 'healthy node')} free in pool {pool.name}")
        share = self.fleet.fair_share_gpus(job.team_id)
        if self.fleet.fair and team.held > share:
            reason += f"; team fair share: holds {team.held} of its {share}-GPU share"
        return reason

    def _room_reason(self, room: sharing.Room) -> str:
        parts = []
        by_borrower: dict[str, int] = defaultdict(int)
        for victim in room.reclaim:
            by_borrower[self.names.get(victim.team_id, str(victim.team_id))] += \
                victim.world_size
        for borrower, gpus in sorted(by_borrower.items()):
            parts.append(f"reclaiming {_plural(gpus, 'GPU')} lent to team {borrower}")
        for victim in room.victims:
            if victim not in room.reclaim:
                parts.append(f"will preempt job #{victim.id} (priority {victim.priority}) "
                             "after its checkpoint")
        return "; ".join(parts)

    def _admit(self, job, pool, plan: dict[int, int]) -> None:
        borrowed = sum(plan.values())
        lenders = ", ".join(f"team {self.names.get(t, t)}" for t in plan)
        note = f"borrowing {borrowed} idle GPUs from {lenders}" if borrowed else ""
        self.queueing.append(self._decide(job, pool, borrowed=borrowed, note=note,
                                          borrowed_from={str(t): g for t, g in plan.items()}))
        self.fleet.take(job, plan)
        self.free[pool.id] -= job.num_nodes

    def _decide(self, job: TrainingJob, pool: NodePool, *, borrowed: int, borrowed_from: dict,
                note: str) -> GoodputEntry | None:
        """The job's admission, held in memory until the pass writes them all;
        returns its queueing span."""
        waited_since = job.phase_changed_at
        # The cluster pass reads its clock before it waits for the cluster's
        # row lock; a job queued meanwhile must not be admitted before it was.
        now = max(self.now, waited_since)
        message = f"admitted on pool {pool.name}: {job.num_nodes} × {job.gpus_per_node} GPUs"
        evidence = {"pool": pool.name, "gpus": job.world_size, "nodes": job.num_nodes,
                    "borrowed_gpus": borrowed, "borrowed_from": borrowed_from}
        job.conditions = preemption.clear_nomination(job)
        job.phase_changed_at = job.admitted_at = now
        job.pending_reason, job.pool, job.preempted_at = "", pool, None
        job.borrowed_gpus, job.borrowed_from = borrowed, borrowed_from
        self.admitted.append((job, f"{message}; {note}" if note else message, evidence))
        return goodput.queueing_entry(job, waited_since, now)

    def write_admissions(self) -> None:
        TrainingJob.transition_many(
            self.admitted, Phase.ADMITTED, source=Phase.QUEUED, reason="Admitted",
            fields=("admitted_at", "pending_reason", "pool", "borrowed_gpus", "borrowed_from",
                    "preempted_at", "conditions"))
        # One message per hundred jobs, fanned out by a worker: a send is a
        # broker round trip, and hundreds of them would cost the pass more
        # than its own writes.
        ids = [job.id for job, _, _ in self.admitted]
        for start in range(0, len(ids), WAKE_BATCH):
            batch = ids[start:start + WAKE_BATCH]
            (RECONCILE_JOB if len(batch) == 1 else RECONCILE_JOBS).soon(*batch)


def queue_position(job: TrainingJob) -> int:
    """The job's place among the cluster's queued jobs, in admission order."""
    same = Q(priority=job.priority)
    ahead = TrainingJob.objects.filter(
        cluster_id=job.cluster_id, phase=Phase.QUEUED, cancel_requested_at__isnull=True
    ).filter(
        Q(priority__gt=job.priority)
        | same & Q(created_at__lt=job.created_at)
        | same & Q(created_at=job.created_at, id__lt=job.id)
    )
    return ahead.count() + 1


def note_position(job: TrainingJob) -> None:
    """A job sent back to the queue outside an admission pass (no nodes at
    launch, a failed preflight) keeps the reason it was given, with its place
    in the queue added; the next pass writes its own."""
    # Called once, by the pass that sent the job back: its reason is fresh.
    if job.phase != Phase.QUEUED or not job.pending_reason:
        return
    reason = f"{job.pending_reason}; position {queue_position(job)} in queue"[:500]
    TrainingJob.objects.filter(pk=job.pk, phase=Phase.QUEUED).update(pending_reason=reason)
    job.pending_reason = reason


def _store_reasons(queued: list[TrainingJob], reasons: dict[int, str]) -> None:
    changed = []
    for job in queued:
        reason = reasons.get(job.id)
        if reason is not None and job.pending_reason != reason:
            job.pending_reason = reason[:500]
            changed.append(job)
    if changed:
        TrainingJob.objects.bulk_update(changed, ["pending_reason"], batch_size=500)
