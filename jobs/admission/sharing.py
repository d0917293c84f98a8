"""Sharing one cluster between teams, as one admission pass sees it.

- Borrowing: a team whose quota has `can_borrow` may hold GPUs beyond its
  quota out of other teams' idle quota on the same cluster. A lender's idle
  quota is its quota less what it holds itself, less what it has lent, less
  what its queued jobs ask: GPUs its own queue is about to want are never
  lent. A borrowing gang is marked (`borrowed_gpus`, `borrowed_from`).
- Fair share: teams take turns in the order of GPUs held per unit of
  `priority_weight` (weighted max-min over GPUs); job priority, then a
  preempted job first, then submit time, orders jobs within a team.
- Preemption: a job that fits within its team's quota but finds its GPUs
  lent reclaims the borrowers; a job whose own team's quota is held by its
  lower-priority jobs preempts them. Victims are picked only if taking them
  all makes the waiter fit, lowest priority and newest first; they are asked
  to checkpoint and stop (jobs/reconcile/preemption.py carries it out).
- Eval runs (jobs/evals/) are spare-capacity work: any training job short
  of nodes in their pool takes them first, whatever their team, and they
  are stopped at once (nothing to checkpoint); an eval run never preempts
  anything, and it is not counted against its team's running-jobs limit.

Everything here is arithmetic on rows the pass read under its locks; the
pass (jobs/admission/) writes the results.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from dataclasses import dataclass, field

from clusters.models import Node, NodePool
from jobs.models import Phase, TrainingJob

# The conditions the pass writes: on a victim (asked to checkpoint and stop,
# by whom) and on the job it makes room for.
EVICTING = "Evicting"
NOMINATED = "Nominated"


@dataclass
class TeamState:
    team_id: int
    name: str
    quota: object | None = None
    held: int = 0  # GPUs its gangs hold, borrowed ones included
    borrowed: int = 0  # of `held`, beyond its quota
    lent: int = 0  # of its quota, held by other teams' gangs
    jobs: int = 0
    asked: int = 0  # GPUs its queued jobs ask

    @property
    def own_use(self) -> int:
        return self.held - self.borrowed

    @property
    def quota_free(self) -> int:
        return max(0, self.quota.gpus - self.own_use) if self.quota else 0

    @property
    def idle(self) -> int:
        """What it can lend now."""
        if self.quota is None:
            return 0
        return max(0, self.quota.gpus - self.own_use - self.lent - self.asked)

    @property
    def weight(self) -> int:
        return max(1, self.quota.priority_weight) if self.quota else 1

    @property
    def share(self) -> float:
        return self.held / self.weight


@dataclass
class Holder:
    """A gang that holds GPUs on the cluster, as a possible victim."""

    id: int
    name: str
    team_id: int
    pool_id: int | None
    priority: int
    num_nodes: int
    world_size: int
    phase: str
    borrowed_gpus: int
    borrowed_from: dict
    admitted_at: object
    evicting_for: int | None  # the waiter it is being preempted for
    is_eval: bool = False

    @property
    def own_quota_gpus(self) -> int:
        return self.world_size - self.borrowed_gpus


@dataclass
class Fleet:
    teams: dict[int, TeamState]
    holders: list[Holder]
    capacity: int  # GPUs of the cluster's ready working nodes
    fair: bool
    nominated: set[int] = field(default_factory=set)

    _index: dict | None = None

    def index(self) -> dict:
        """{"team": {team id: its gangs}, "lent": {lender id: borrowing gangs},
        "eval": {pool id: eval runs}}."""
        if self._index is None:
            team: dict[int, list[Holder]] = defaultdict(list)
            lent: dict[str, list[Holder]] = defaultdict(list)
            evals: dict[int | None, list[Holder]] = defaultdict(list)
            for holder in self.holders:
                team[holder.team_id].append(holder)
                for lender in holder.borrowed_from:
                    lent[lender].append(holder)
                if holder.is_eval:
                    evals[holder.pool_id].append(holder)
            self._index = {"team": team, "lent": lent, "eval": evals}
        return self._index

    def fair_share_gpus(self, team_id: int) -> int:
        """The team's weighted slice of the cluster among teams that hold or ask."""
        active = [t for t in self.teams.values() if t.held or t.asked]
        total = sum(t.weight for t in active) or 1
        return int(self.capacity * self.teams[team_id].weight / total)

    def borrow_plan(self, team: TeamState, need: int) -> dict[int, int] | None:
        """{lender team id: GPUs} covering `need` from other teams' idle
        quota, most idle first; None when it cannot be covered."""
        plan: dict[int, int] = {}
        for lender in sorted(self.teams.values(), key=lambda t: (-t.idle, t.team_id)):
            if need <= 0 or lender.idle <= 0:
                break
            if lender.team_id == team.team_id:
                continue
            take = min(lender.idle, need)
            plan[lender.team_id] = take
            need -= take
        return plan if need <= 0 else None

    def idle_for(self, team: TeamState) -> int:
        return sum(t.idle for t in self.teams.values() if t.team_id != team.team_id)

    def take(self, job: TrainingJob, plan: dict[int, int]) -> None:
        """Book an admitted gang into the pass's figures."""
        team = self.teams[job.team_id]
        team.held += job.world_size
        team.borrowed += sum(plan.values())
        team.jobs += 0 if job.is_eval else 1
        team.asked = max(0, team.asked - job.world_size)
        for lender_id, gpus in plan.items():
            self.teams[lender_id].lent += gpus


def load(cluster, queued: list[TrainingJob], quotas: dict, team_names: dict) -> Fleet:
    teams = {tid: TeamState(tid, team_names.get(tid, str(tid)), quota=q)
             for tid, q in quotas.items()}
    for job in queued:
        teams.setdefault(job.team_id, TeamState(job.team_id, team_names.get(job.team_id, "")))
        teams[job.team_id].asked += job.world_size
    holders = []
    for row in TrainingJob.objects.filter(
            cluster_id=cluster.id, phase__in=TrainingJob.HOLDS_GPUS).values(
            "id", "name", "team_id", "pool_id", "priority", "num_nodes", "gpus_per_node",
            "phase", "borrowed_gpus", "borrowed_from", "admitted_at", "conditions", "kind"):
        team = teams.setdefault(row["team_id"], TeamState(row["team_id"],
                                                          team_names.get(row["team_id"], "")))
        world = row["num_nodes"] * row["gpus_per_node"]
        team.held += world
        team.borrowed += row["borrowed_gpus"]
        is_eval = row["kind"] == TrainingJob.Kind.EVAL
        team.jobs += 0 if is_eval else 1
        for lender, gpus in (row["borrowed_from"] or {}).items():
            lender_team = teams.setdefault(int(lender), TeamState(int(lender), ""))
            lender_team.lent += int(gpus)
        evicting = next((c for c in row["conditions"] or [] if c.get("type") == EVICTING), None)
        holders.append(Holder(
            id=row["id"], name=row["name"], team_id=row["team_id"], pool_id=row["pool_id"],
            priority=row["priority"], num_nodes=row["num_nodes"], world_size=world,
            phase=row["phase"], borrowed_gpus=row["borrowed_gpus"],
            borrowed_from=row["borrowed_from"] or {}, admitted_at=row["admitted_at"],
            evicting_for=evicting.get("by") if evicting else None, is_eval=is_eval))
    capacity = 0
    gpus_per_pool = dict(NodePool.objects.filter(cluster_id=cluster.id)
                         .values_list("id", "gpus_per_node"))
    for pool_id in Node.objects.filter(cluster_id=cluster.id, state=Node.State.READY,
                                       is_spare=False).values_list("pool_id", flat=True):
        capacity += gpus_per_pool.get(pool_id, 0)
    nominated = {j.id for j in queued
                 if any(c.get("type") == NOMINATED for c in j.conditions or [])}
    return Fleet(teams, holders, capacity, cluster.config.fair_share, nominated)


def admission_order(queued: list[TrainingJob], fleet: Fleet):
    """Yield queued jobs in the order the pass considers them: jobs that
    victims are already making room for first (the room is theirs), then,
    with fair share on, the team holding least per unit of weight takes its
    next job (re-read after each, so an admission moves its team back);
    with it off, the queue order (priority, then submit time)."""
    # Split before yielding: the pass drops nominations as it goes.
    first = [j for j in queued if j.id in fleet.nominated]
    rest = [j for j in queued if j.id not in fleet.nominated]
    yield from first
    if not fleet.fair:
        yield from rest
        return
    by_team: dict[int, deque] = defaultdict(deque)
    for job in rest:  # already in queue order: priority, preempted first, submit time
        by_team[job.team_id].append(job)

    def entry(team_id):
        head = by_team[team_id][0]
        return (fleet.teams[team_id].share, -head.priority, head.created_at, head.id, team_id)

    heap = [entry(tid) for tid in by_team]
    heapq.heapify(heap)
    while heap:
        team_id = heapq.heappop(heap)[-1]
        yield by_team[team_id].popleft()
        if by_team[team_id]:
            heapq.heappush(heap, entry(team_id))


@dataclass
class Room:
    """Victims whose stop makes a waiter fit."""

    victims: list[Holder]
    reclaim: list[Holder]  # of the victims, borrowers of the waiter's team's GPUs

    @property
    def new(self) -> list[Holder]:
        return [v for v in self.victims if v.evicting_for is None]


def make_room(job: TrainingJob, pool_id: int, fleet: Fleet, quota_short: int,
              nodes_short: int) -> Room | None:
    """The victims to stop so that `job` fits, or None if no choice of them
    would make it fit (then nobody is stopped). Borrowers of the waiter's
    team's quota in its pool first, then the team's own lower-priority
    gangs; lowest priority and newest first within each. Eval runs in its
    pool, any team's, go before all of them; an eval run makes room for
    nobody."""
    if job.is_eval:
        return None
    team_key = str(job.team_id)
    # Only the team's own gangs, its borrowers and the pool's eval runs can
    # be victims: a pass over a long queue looks at those, never at every
    # gang of the cluster.
    mine = fleet.index()
    evals = [h for h in mine["eval"].get(pool_id, ())
             if h.phase in (Phase.STARTING, Phase.RUNNING) and h.team_id != job.team_id]
    live = [h for h in (*mine["team"].get(job.team_id, ()), *mine["lent"].get(team_key, ()))
            if h.phase in (Phase.STARTING, Phase.RUNNING)]
    live += evals
    already = [h for h in live if h.evicting_for == job.id]
    free_to_take = [h for h in live if h.evicting_for is None]
    reclaimable = [h for h in free_to_take
                   if team_key in h.borrowed_from and h.pool_id == pool_id]
    lower = [h for h in free_to_take if h.team_id == job.team_id and h.priority < job.priority]
    newest_lowest = lambda h: (h.priority, -(h.admitted_at.timestamp() if h.admitted_at else 0))  # noqa: E731
    spare = [h for h in free_to_take if h.is_eval and h.pool_id == pool_id
             and h not in reclaimable]
    lower = [h for h in lower if h not in spare]
    candidates = (sorted(spare, key=newest_lowest) + sorted(reclaimable, key=newest_lowest)
                  + sorted(lower, key=newest_lowest))
    chosen: list[Holder] = []
    for victim in [*already, *candidates]:
        if quota_short <= 0 and nodes_short <= 0:
            break
        frees_quota = victim.own_quota_gpus if victim.team_id == job.team_id else 0
        frees_nodes = victim.num_nodes if victim.pool_id == pool_id else 0
        if victim in already or (frees_quota and quota_short > 0) or (
                frees_nodes and nodes_short > 0):
            chosen.append(victim)
            quota_short -= frees_quota
            nodes_short -= frees_nodes
    if quota_short > 0 or nodes_short > 0 or not chosen:
        return None
    return Room(chosen, [v for v in chosen if team_key in v.borrowed_from])
