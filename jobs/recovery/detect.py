"""Detect and classify an attempt's failure.

Detect: a rank exited (the provider's observation), a critical health event
on one of the attempt's nodes, heartbeats missed past the deadline (a hang).
Classify: each ended node gets a class of its own (`node_class`, a pure
function of what its ranks left behind); the attempt's root cause is the
highest of them by `PRECEDENCE`: code error > a node killed or lost
(hardware) > preempted > transient; an attempt its gang scheduler took back
(Kueue) is preempted, unless a code error came first. A node whose ranks were killed while
the others then failed with exit 84 is one hardware failure of that node:
the 84s are its collateral.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from regatta.contract import CODE_EXITS
from regatta.contract import EXIT_COLLECTIVE as TRANSIENT_EXIT
from regatta.contract import EXIT_CONFIG as CONFIG_EXIT
from regatta.contract import EXIT_PREEMPTED as PREEMPTED_EXIT

from clusters.models import NodeHealthEvent
from controlplane.lib import receiver
from jobs.context import Ctx
from jobs.recovery import signature

from ..models import FailureClass, JobAttempt, JobEvent, RankStatus
from . import budgets

# A node's class, from what its processes left behind. KILLED is a node
# whose ranks did not end by themselves: the hardware class of the attempt
# (until the node's own evidence is weighed: jobs/recovery/evidence.py).
# PROGRAM is a program that reports nothing of itself (no SDK) and failed:
# a rank exited non-zero or crashed (SIGSEGV, SIGABRT), which is the
# program's doing as far as anyone can tell.
CODE, KILLED, PROGRAM, PREEMPTED, TRANSIENT = (
    "code", "killed", "program", "preempted", "transient")
# Root cause first: the first class any node has is the attempt's. A rank
# SIGKILLed (the OOM killer, a lost node) makes its peers fail in turn: their
# exits are collateral of the kill.
PRECEDENCE = (CODE, KILLED, PROGRAM, PREEMPTED, TRANSIENT)
SIGKILL = 9


@dataclass
class Failure:
    cls: str
    reason: str
    nodes: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    exit_code: int | None = None
    failed_at: datetime | None = None
    hang_s: float = 0.0
    health_event_ids: list[int] = field(default_factory=list)
    replace: bool = True  # retire the bad nodes (a drain by an operator keeps them)


@dataclass(frozen=True)
class Detection:
    """What a look at a running attempt found: a failure, nothing, a
    failure whose root cause may still show up (wait, then look again), or a
    gang held back before it started (the provider's StartIssues: capacity,
    a queue), which is a wait with its reason, never a hang."""

    failure: Failure | None = None
    wait_for_root_cause: bool = False
    waits: tuple = ()


# The job condition that remembers an attempt waited to start (waiting.py
# keeps it); the first-heartbeat deadline counts from the end of that wait.
START_WAIT = "StartWait"


def node_class(proc, ranks_per_node: int) -> str | None:
    """The class of one ended node process, or None if it ended cleanly."""
    if proc.signal is not None or (proc.exit_code is not None and proc.exit_code < 0):
        return KILLED
    codes = {r.get("exit_code") for r in proc.ranks}
    classes = {r.get("failure_class") for r in proc.ranks}
    failed = proc.exit_code not in (0, None)
    if codes & CODE_EXITS:
        return CODE
    if failed and not proc.ranks:
        # Nothing of the program's own (no SDK): torchrun's report says how
        # its ranks ended.
        return _unreported(proc)
    if failed and len(proc.ranks) < ranks_per_node:
        # A rank of this node left no exit record beside its peers': it was
        # killed, and whatever its peers then exited with is collateral.
        return KILLED
    if "code" in classes or proc.exit_code == CONFIG_EXIT:
        return CODE
    if PREEMPTED_EXIT in codes or proc.exit_code == PREEMPTED_EXIT or "preempted" in classes:
        return PREEMPTED
    if TRANSIENT_EXIT in codes or proc.exit_code == TRANSIENT_EXIT or "transient" in classes:
        return TRANSIENT
    # The launcher failed and no rank wrote its exit record: the ranks did
    # not end by themselves, they were killed.
    return KILLED if failed else None


def _unreported(proc) -> str:
    """A failed node whose program wrote no exit records: KILLED when
    torchrun says its first failed rank was SIGKILLed (the OOM killer, the
    node going), else the program's own failure (an exit 1, a crash)."""
    if proc.node_lost:
        return KILLED
    cause = signature.root_cause(proc.log_tail)
    if cause is not None and cause.exit_code == -SIGKILL:
        return KILLED
    return PROGRAM


def group_by_class(procs, ranks_per_node: int) -> dict[str, list]:
    groups: dict[str, list] = {cls: [] for cls in PRECEDENCE}
    for proc in procs:
        cls = node_class(proc, ranks_per_node)
        if cls is not None:
            groups[cls].append(proc)
    return groups


def root_cause(groups: dict[str, list], crashed_with_code: list[JobEvent],
               status) -> Failure | None:
    """The attempt's failure from its nodes' classes (and code errors the
    trainer reported in a `crashed` event), by PRECEDENCE."""
    if groups[CODE] or crashed_with_code:
        return _code_failure(groups[CODE], crashed_with_code)
    if status.taken_back:
        # Its ranks were stopped because the gang scheduler (Kueue) took the
        # attempt back: a preemption of the job, pinned to no node, whose
        # relaunch goes through the scheduler again.
        return Failure(FailureClass.PREEMPTED, status.taken_back,
                       evidence={"source": budgets.GANG_SCHEDULER,
                                 "message": status.taken_back},
                       replace=False)
    if groups[KILLED]:
        return _killed_failure(groups)
    if groups[PROGRAM]:
        return _program_failure(groups[PROGRAM])
    if groups[PREEMPTED]:
        procs = groups[PREEMPTED]
        return Failure(FailureClass.PREEMPTED, "ranks stopped after an emergency checkpoint",
                       nodes=[p.node for p in procs], exit_code=PREEMPTED_EXIT,
                       evidence=_evidence(procs), replace=False)
    if groups[TRANSIENT]:
        procs = groups[TRANSIENT]
        return Failure(FailureClass.TRANSIENT, "a collective or rendezvous failed",
                       nodes=[p.node for p in procs], exit_code=TRANSIENT_EXIT,
                       evidence=_evidence(procs), replace=False)
    if status.state == "failed":
        return Failure(FailureClass.TRANSIENT, status.message or "the attempt failed",
                       evidence={"message": status.message}, replace=False)
    return None


def _code_failure(procs, crashed: list[JobEvent]) -> Failure:
    error = _user_error(procs)
    detail = (_first_error(procs) or (crashed[0].message if crashed else "")
              or (error.line if error else ""))
    return Failure(FailureClass.CODE, f"the training program failed: {detail}".strip(),
                   nodes=[p.node for p in procs], exit_code=_exit(procs) or 1,
                   evidence={**_evidence(procs), "crash_events": [e.id for e in crashed],
                             **({"error": error.as_evidence()} if error else {})},
                   replace=False)


def _program_failure(procs) -> Failure:
    """A program without the SDK failed by itself: the job's, relaunched in
    place; no node is blamed for it (a crash loop ends it: jobs/recovery/)."""
    # The node whose log holds the program's own error goes first: its
    # rank is the root cause, the others' "a peer died" is collateral.
    procs = sorted(procs, key=lambda p: _collateral_log(p))
    first = procs[0]
    error = _user_error(procs)
    detail = f": {error.line}" if error else ""
    return Failure(FailureClass.PROCESS,
                   f"the program failed on {', '.join(p.node for p in procs)} "
                   f"({_how(first)}){detail}"[:2000],
                   nodes=[p.node for p in procs], exit_code=_exit(procs),
                   evidence={**_evidence(procs), "program": True,
                             **({"error": error.as_evidence()} if error else {})},
                   replace=False)


def _how(proc) -> str:
    cause = signature.root_cause(proc.log_tail)
    if cause is not None and cause.exit_code is not None:
        rank = "" if cause.rank is None else f"rank {cause.rank} "
        return (f"{rank}signal {-cause.exit_code}" if cause.exit_code < 0
                else f"{rank}exit {cause.exit_code}")
    return f"signal {proc.signal}" if proc.signal else f"exit {proc.exit_code}"


def _collateral_log(proc) -> bool:
    found = signature.user_error(proc.log_tail)
    return found is None or signature.is_collateral(found.line)


def _user_error(procs) -> signature.UserError | None:
    """The program's own error line: from the first node whose log shows one
    of its own, before any that only says a peer died under it."""
    found = [e for e in (signature.user_error(p.log_tail) for p in procs) if e is not None]
    own = [e for e in found if not signature.is_collateral(e.line)]
    return (own or found or [None])[0]


def _killed_failure(groups: dict[str, list]) -> Failure:
    killed = groups[KILLED]
    names = [p.node for p in killed]
    collateral = [p.node for p in groups[TRANSIENT] + groups[PREEMPTED]]
    error = _user_error(killed)
    return Failure(FailureClass.HARDWARE,
                   f"ranks on {', '.join(names)} were killed or lost ({_ended(killed[0])})",
                   nodes=names, exit_code=_exit(killed),
                   evidence={**_evidence(killed), "collateral": collateral,
                             **({"error": error.as_evidence()} if error else {})})


def _ended(proc) -> str:
    """How a node's processes ended, in the words a person reads: only what
    is known (a lost node has neither a signal nor an exit code)."""
    parts = [f"signal {proc.signal}"] if proc.signal else []
    if proc.exit_code is not None:
        parts.append(f"exit {proc.exit_code}")
    return ", ".join(parts) or "no exit status: the node is gone"


def classify_exits(ctx: Ctx, attempt: JobAttempt, status) -> Failure | None:
    ended = [n for n in status.nodes if not n.running]
    groups = group_by_class(ended, ctx.job.gpus_per_node)
    crashed = JobEvent.objects.filter(job=ctx.job, attempt=attempt, kind="TrainerCrashed")
    with_code = [e for e in crashed if _crash_class(e) == "code"]
    return root_cause(groups, with_code, status)


def _crash_class(event) -> str | None:
    ev = event.evidence or {}
    return ev.get("failure_class") or (ev.get("data") or {}).get("failure_class")


def _exit(procs) -> int | None:
    for p in procs:
        if p.signal is not None:
            return -p.signal
        if p.exit_code is not None:
            return p.exit_code
    return None


def _first_error(procs) -> str:
    errors = (str(r["error"]) for p in procs for r in p.ranks if r.get("error"))
    return next(errors, "")[:300]


def _evidence(procs) -> dict:
    return {"nodes": [_proc_evidence(p) for p in procs]}


def _proc_evidence(p) -> dict:
    evidence = {"node": p.node, "exit_code": p.exit_code, "signal": p.signal,
                "ranks": list(p.ranks)[:16], "log_tail": (p.log_tail or "")[-2000:]}
    if p.node_lost:
        evidence["node_lost"] = p.node_lost
    return evidence


def health_failure(ctx: Ctx, attempt: JobAttempt) -> Failure | None:
    node_ids = list(attempt.placements.values_list("node_id", flat=True))
    events = list(
        NodeHealthEvent.objects.filter(
            node_id__in=node_ids, handled_at__isnull=True,
            severity=NodeHealthEvent.Severity.CRITICAL,
        ).exclude(kind=NodeHealthEvent.Kind.SPOT_NOTICE).select_related("node")
    )
    if not events:
        return None
    names = sorted({e.node.name for e in events})
    return Failure(
        FailureClass.HARDWARE,
        f"critical health events on {', '.join(names)}: "
        + "; ".join(f"{e.kind} {e.message}" for e in events)[:400],
        nodes=names, health_event_ids=[e.id for e in events],
        evidence={"health_events": [health_evidence(e) for e in events]},
    )


def health_evidence(event: NodeHealthEvent) -> dict:
    return {"id": event.id, "node": event.node.name, "kind": event.kind,
            "message": event.message, "evidence": event.evidence}


def expects_heartbeats(job, ranks) -> bool:
    """The built-in trainer always reports; a program of the job's own is
    watched by its processes' liveness until its first heartbeat, then held
    to the deadlines like the trainer (docs/byo.md)."""
    return not job.entrypoint or bool(ranks)


def hang_failure(ctx: Ctx, attempt: JobAttempt) -> Failure | None:
    ranks = list(RankStatus.objects.filter(attempt=attempt))
    if not expects_heartbeats(ctx.job, ranks):
        return None
    known, since = receiver.listening(ctx.now.timestamp())
    if known and since is None:
        # No web is listening: no rank could be heard, and its silence says
        # nothing about it. The pass after the web is back judges again.
        return None
    heard_from = datetime.fromtimestamp(since, tz=ctx.now.tzinfo) if since else None
    return (_silence(ctx, attempt, ranks, heard_from)
            or _no_first_step(ctx, attempt, ranks, heard_from))


def _heard(at: datetime, heard_from: datetime | None) -> datetime:
    """The moment silence starts counting: not before a web was back to hear."""
    return max(at, heard_from) if heard_from is not None else at


def _silence(ctx: Ctx, attempt: JobAttempt, ranks, heard_from) -> Failure | None:
    """Ranks whose heartbeats stopped, or that were never heard from within
    `first_heartbeat_deadline_s` of the launch."""
    deadline = ctx.config.heartbeat_deadline
    now = ctx.now
    silent = [r for r in ranks
              if (now - _heard(r.last_heartbeat_at, heard_from)).total_seconds() > deadline]
    missing = _never_reported(ctx, attempt, ranks, heard_from)
    if not silent and not missing:
        return None
    last = min((r.last_heartbeat_at for r in silent), default=attempt.started_at)
    world = ctx.job.world_size
    # Every rank silent points at the control plane's side, not at a node:
    # restart, but take no node out of service on that evidence.
    everyone = len(silent) + len(missing) >= world
    startup = ctx.config.first_heartbeat_deadline_s
    parts = []
    if silent:
        parts.append(f"no heartbeat from ranks {sorted(r.rank for r in silent)} for more than "
                     f"{deadline:g}s")
    if missing:
        parts.append(f"start-up: no heartbeat from ranks {missing} within {startup:g}s of the "
                     "launch")
    return Failure(
        FailureClass.HANG, "; ".join(parts),
        nodes=[] if everyone else _hung_nodes(ctx, attempt, silent, missing),
        evidence={"deadline_s": deadline, "first_heartbeat_deadline_s": startup,
                  "silent": [{"rank": r.rank, "node": r.node_name, "step": r.step,
                              "last_heartbeat_at": r.last_heartbeat_at.isoformat()}
                             for r in silent],
                  "never_reported": missing},
        failed_at=last, hang_s=max(0.0, (now - last).total_seconds()),
    )


def _never_reported(ctx: Ctx, attempt: JobAttempt, ranks, heard_from) -> list[int]:
    """Ranks with no heartbeat at all, once the first-heartbeat deadline passed
    since the launch, or since the gang last waited for capacity or a queue
    (or since the web was back)."""
    world = ctx.job.world_size
    if attempt.started_at is None or len(ranks) >= world:
        return []
    since = _heard(attempt.started_at, heard_from)
    wait = ctx.condition(START_WAIT)
    if wait is not None and wait.get("attempt") == attempt.id:
        since = max(since, datetime.fromtimestamp(wait["last"], tz=ctx.now.tzinfo))
    waited = (ctx.now - since).total_seconds()
    if waited <= ctx.config.first_heartbeat_deadline_s:
        return []
    seen = {r.rank for r in ranks}
    return [r for r in range(world) if r not in seen]


def _no_first_step(ctx: Ctx, attempt: JobAttempt, ranks, heard_from) -> Failure | None:
    """Every rank reports, yet no step came within `first_step_deadline_s`: a
    start-up stuck in compilation, a collective's set-up or data loading."""
    if attempt.first_step_at is not None or attempt.last_step > 0:
        return None
    reporting = ctx.condition(ALL_REPORTING)
    if reporting is None or reporting.get("attempt") != attempt.id:
        return None
    since = _heard(datetime.fromtimestamp(reporting["at"], tz=ctx.now.tzinfo), heard_from)
    waited = (ctx.now - since).total_seconds()
    limit = ctx.config.first_step_deadline_s
    if waited <= limit:
        return None
    return Failure(
        FailureClass.HANG,
        f"start-up: no first step within {limit:g}s of every rank reporting",
        nodes=[],  # every rank is alive and waiting: no node to blame
        evidence={"first_step_deadline_s": limit, "reporting_since": since.isoformat(),
                  "ranks": len(ranks)},
        failed_at=since, hang_s=waited,
    )


# The condition the job reconcile keeps once every rank of an attempt reported.
ALL_REPORTING = "RanksReporting"


def _hung_nodes(ctx: Ctx, attempt: JobAttempt, silent, missing) -> list[str]:
    placements = {p.node_rank: p.node.name for p in attempt.placements.select_related("node")}
    names = set(placements.values())
    per_node = ctx.job.gpus_per_node
    bad = {r.node_name if r.node_name in names else placements.get(r.rank // per_node)
           for r in silent}
    bad |= {placements.get(rank // per_node) for rank in missing}
    bad.discard(None)
    return sorted(bad)


def detect(ctx: Ctx, attempt: JobAttempt, status) -> Detection:
    failure = classify_exits(ctx, attempt, status)
    if failure is not None and failure.cls == FailureClass.TRANSIENT:
        return _settle_transient(ctx, attempt, status, failure)
    if failure is not None and _only_collateral(failure) and _root_cause_may_follow(
            ctx, attempt, status):
        # A rank whose peer died under it ("Connection closed by peer") may
        # be seen before the peer's own error: wait for it, so the failure
        # is told by its cause (the crash loop's signature included).
        return Detection(wait_for_root_cause=True)
    if failure is not None:
        return Detection(failure)
    if status.state == "succeeded":
        # Every rank exited 0: silent heartbeats since then are the ranks
        # having finished, however late this pass comes, not a hang.
        return Detection()
    user_errors = status.user_errors
    if user_errors:
        return Detection(start_failure(user_errors))
    health = health_failure(ctx, attempt)
    waits = status.waits
    if health is None and waits:
        return Detection(waits=waits)
    return Detection(health or hang_failure(ctx, attempt))


def start_failure(issues) -> Failure:
    """The job's own mistake seen before any process ran (an image that does
    not exist, a Secret it names that is missing): a code error, failed fast
    with the platform's message, since no relaunch can fix it."""
    first = issues[0]
    return Failure(FailureClass.CODE, f"the attempt cannot start: {first.describe()}"[:500],
                   evidence={"start_issues": [{"reason": i.reason, "message": i.message,
                                               "node_rank": i.node_rank} for i in issues]},
                   replace=False)


def _only_collateral(failure: Failure) -> bool:
    """A program's failure whose only error line is a peer's death."""
    error = (failure.evidence.get("error") or {}).get("line")
    return bool(failure.evidence.get("program")) and signature.is_collateral(error or "")


def _root_cause_may_follow(ctx: Ctx, attempt: JobAttempt, status) -> bool:
    """Whether to wait longer for a failure's root cause: other nodes still
    run and `root_cause_grace_s` has not passed since the failure was seen."""
    first_seen = ctx.condition("RootCauseWait")
    if first_seen is None or first_seen.get("attempt") != attempt.id:
        ctx.set_condition("RootCauseWait", attempt=attempt.id, at=ctx.now.timestamp())
        first_seen = ctx.condition("RootCauseWait")
    waited = ctx.now.timestamp() - first_seen["at"]
    still_running = any(n.running for n in status.nodes)
    return still_running and waited < ctx.config.root_cause_grace_s


def _settle_transient(ctx: Ctx, attempt: JobAttempt, status, failure: Failure) -> Detection:
    """A peer that exits 84 may be seen before the rank that died and caused
    it: wait `root_cause_grace_s` for the root cause while others still run;
    silent peers by then are the cause, not a second failure."""
    if _root_cause_may_follow(ctx, attempt, status):
        return Detection(wait_for_root_cause=True)
    hang = hang_failure(ctx, attempt)
    if hang is not None and hang.nodes:
        return Detection(hang)
    return Detection(failure)
