"""Starting an attempt: choose nodes, check them, launch the gang.

admitted/restarting → (preflight) → starting. A node that fails the preflight
check is cordoned with the evidence and swapped for a spare or a free node;
with no replacement the job goes back to the queue with the reason. When
every chosen node passed a check within `preflight_max_age_s` (the survivors
at the launch before, a promoted spare when it joined) the check is skipped:
it would put seconds on recovery's critical path to learn nothing new.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction
from regatta import contract

from clusters.acts import cordon_with_evidence, fill_vacancies, judge_check
from clusters.models import Cluster, Node, NodeHealthEvent
from clusters.providers import LaunchRequest, Placement, PreflightResult
from controlplane.lib import locks
from controlplane.lib.errors import CannotRun
from controlplane.lib.reconcile import Result
from controlplane.lib.transitions import event_time
from jobs import evals, signals
from jobs.admission import busy_node_ids, placement, request_admission
from jobs.context import Ctx
from jobs.recovery import evidence as recovery_evidence
from jobs.recovery import resume
from jobs.worker_api.tokens import issue as issue_token

from ..checkpointing import abandon_branch, job_checkpoint_uri
from ..models import AttemptNode, FailureClass, JobAttempt, Phase, TrainingJob

MAX_PREFLIGHT_ROUNDS = 3
# How soon a pass looks again at a preflight that runs beside it.
PREFLIGHT_POLL_S = 1.0


def start(ctx: Ctx) -> Result:
    job = ctx.job
    if job.phase == Phase.RESTARTING:
        backoff = ctx.condition("RestartBackoff")
        if backoff is not None and ctx.now.timestamp() < backoff["until"]:
            return Result.after(backoff["until"] - ctx.now.timestamp(), "backing off")
    attempt = ctx.live_attempt()
    if attempt is None and job.is_eval and evals.source_checkpoint(job) is None:
        return _source_gone(ctx)
    if attempt is None:
        attempt = _create_attempt(ctx)
        if attempt is None:
            return _no_nodes(ctx)
    if attempt.state == JobAttempt.State.PREFLIGHT:
        if ctx.config.preflight_on and not attempt.preflight.get("ok"):
            checked = _preflight(ctx, attempt)
            if checked is None:
                # The check runs beside the pass (PreflightResult.pending).
                return Result.after(PREFLIGHT_POLL_S, "preflight running")
            if not checked:
                return Result.after(ctx.config.queue_interval_s, "preflight found no nodes")
        signals.launch_point.send(TrainingJob, point="launch", job_id=ctx.job.id)
        try:
            _launch(ctx, attempt)
        except CannotRun as exc:
            return _cannot_run(ctx, attempt, exc)
    return Result.after(min(1.0, ctx.config.observe_interval_s), "launched")


def _cannot_run(ctx: Ctx, attempt: JobAttempt, exc: CannotRun) -> Result:
    """The scheduler says the attempt can never run as asked: the job ends
    with its words (the spec must change), rather than asking forever."""
    job = ctx.job
    reason = str(exc)[:2000]
    attempt.end(JobAttempt.State.FAILED, ctx.now, failure_class=FailureClass.CODE,
                failure_reason=reason)
    job.transition(Phase.FAILED, reason="CannotRun", message=reason[:1000], attempt=attempt,
                   now=ctx.now, finished_at=ctx.now, last_error=reason, pending_reason="",
                   evidence={"error": reason})
    request_admission(ctx.cluster.id)
    return Result.done("cannot run")


def _source_gone(ctx: Ctx) -> Result:
    """An eval run whose checkpoint cannot be loaded any more (found
    corrupt since) has nothing to evaluate: it fails, and says why."""
    job = ctx.job
    reason = f"step {job.eval_step} of job #{job.parent_id} is no longer loadable"
    job.transition(Phase.FAILED, reason="EvalCheckpointGone", message=reason, now=ctx.now,
                   finished_at=ctx.now, last_error=reason, pending_reason="")
    request_admission(ctx.cluster.id)
    return Result.done(reason)


def free_nodes(ctx: Ctx, prefer=()) -> list[Node]:
    """Free working nodes of the job's pool, in the order its gang takes
    them (jobs/admission/placement.py)."""
    busy = busy_node_ids(ctx.cluster.id)
    nodes = [
        n for n in Node.objects.filter(pool=ctx.pool, state=Node.State.READY, is_spare=False)
        .order_by("name")
        if n.id not in busy
    ]
    return placement.order(nodes, ctx.pool.topology_label, ctx.job.num_nodes, prefer)


def _create_attempt(ctx: Ctx) -> JobAttempt | None:
    job = ctx.job
    previous = ctx.last_attempt()
    prefer = []
    if previous is not None:
        # The same nodes, and the spares that replaced the ones taken out.
        prefer = list(previous.placements.values_list("node_id", flat=True))
        prefer += list(Node.objects.filter(replaces_id__in=prefer).values_list("id", flat=True))
    with transaction.atomic():
        # The cluster row serialises node picking: two jobs never take one node.
        # No key update, as admission takes it (jobs/admission/): foreign
        # keys to the cluster are not blocked.
        Cluster.objects.select_for_update(no_key=True).get(pk=ctx.cluster.pk)
        nodes = free_nodes(ctx, prefer)[: job.num_nodes]
        if len(nodes) < job.num_nodes:
            return None
        number = (previous.number + 1) if previous else 1
        attempt = JobAttempt.objects.create(
            job=job, number=number, created_at=ctx.now,
            placement=placement.describe(nodes, ctx.pool.topology_label))
        AttemptNode.objects.bulk_create(
            [AttemptNode(attempt=attempt, node=node, node_rank=i) for i, node in enumerate(nodes)]
        )
    return attempt


def _no_nodes(ctx: Ctx) -> Result:
    job = ctx.job
    free = len(free_nodes(ctx))
    pool_nodes = Node.objects.filter(pool=ctx.pool)
    spares = pool_nodes.filter(state=Node.State.READY, is_spare=True).count()
    coming = pool_nodes.filter(state=Node.State.PROVISIONING).count()
    reason = (f"needs {job.num_nodes} healthy nodes; {free} free in pool {ctx.pool.name}, "
              f"{spares} spare ready, {coming} provisioning")
    if job.phase in (Phase.ADMITTED, Phase.RESTARTING):
        # A restart with no nodes to be had (a fault forgiven, no spare left)
        # waits in the queue, its place kept, rather than holding the GPUs of
        # the nodes that survived (jobs/reconcile/job_pass.py requeues it).
        job.transition(Phase.QUEUED, reason="Requeued", message=reason, now=ctx.now,
                       pending_reason=reason)
    elif job.pending_reason != reason:
        TrainingJob.objects.filter(pk=job.pk).update(pending_reason=reason)
    return Result.after(ctx.config.queue_interval_s, reason)


# Enough to cover a pool's recent casualties; older ones are gone from the
# provider (replaced, terminated) and need no avoiding.
AVOID_MAX = 50


def _avoid(ctx: Ctx) -> tuple[str, ...]:
    """The pool's nodes out of service, newest first: a provider whose
    scheduler chooses the nodes keeps the attempt off them."""
    out = (Node.State.CORDONED, Node.State.DRAINING, Node.State.FAILED, Node.State.REPLACED)
    names = (Node.objects.filter(pool=ctx.pool, state__in=out)
             .order_by("-state_changed_at", "-id").values_list("name", flat=True)[:AVOID_MAX])
    return tuple(sorted(names))


def _placements(attempt: JobAttempt) -> tuple[Placement, ...]:
    return tuple(
        Placement(node=p.node.name, node_rank=p.node_rank, provider_id=p.node.provider_id,
                  address=p.node.address)
        for p in attempt.placements.select_related("node").order_by("node_rank")
    )


def _preflight(ctx: Ctx, attempt: JobAttempt) -> bool | None:
    """Check the chosen nodes; swap out those that fail. False: no nodes;
    None: the check runs on, its result read by a later pass."""
    job = ctx.job
    if _skip_recently_checked(ctx, attempt):
        return True
    for _ in range(MAX_PREFLIGHT_ROUNDS):
        placements = _placements(attempt)
        result = ctx.provider.preflight(ctx.pool_info, placements,
                                        timeout_s=ctx.config.preflight_timeout_s)
        if result.pending:
            return None
        # The check may have taken minutes: act on it only if the job is still ours.
        locks.ensure_held()
        report = {"ok": result.ok, "failed_nodes": list(result.failed_nodes),
                  "message": result.message, **result.evidence}
        JobAttempt.objects.filter(pk=attempt.pk).update(preflight=report)
        attempt.preflight = report
        if result.ok:
            checked = [p.node for p in placements]
            Node.objects.filter(cluster=ctx.cluster, name__in=checked).update(
                preflight_passed_at=ctx.now)
            job.record("PreflightPassed", result.message, attempt=attempt, now=ctx.now,
                       evidence={"allreduce_gbps": result.allreduce_gbps, "nodes": checked})
            return True
        verdict = judge_check(ctx.cluster, result, [p.node for p in placements],
                                      ctx.now)
        if not verdict.blamed:
            # Failing on every node alike (or as it has on others before):
            # the check, not these nodes, is at fault. It tells nothing, so
            # the gang launches as if it had passed.
            job.record("PreflightInconclusive",
                       f"the preflight failed on every node alike ({verdict.suspect}): the "
                       "check is suspect, not the nodes; launching", attempt=attempt,
                       now=ctx.now, evidence={"preflight": report, "suspect": verdict.suspect})
            return True
        for name in verdict.blamed:
            if not _swap_failed_node(ctx, attempt, name, result):
                reason = (f"preflight failed on {name}; no healthy replacement free "
                          f"in pool {ctx.pool.name}")
                attempt.end(JobAttempt.State.FAILED, ctx.now, failure_reason=reason)
                target = Phase.QUEUED
                job.transition(target, reason="Requeued", message=reason, now=ctx.now,
                               attempt=attempt, pending_reason=reason,
                               evidence={"preflight": report})
                return False
    return False


def _skip_recently_checked(ctx: Ctx, attempt: JobAttempt) -> bool:
    """True (and the skip recorded) when every chosen node passed a check
    within `preflight_max_age_s`."""
    max_age = ctx.config.preflight_max_age_s
    nodes = [p.node for p in attempt.placements.select_related("node").order_by("node_rank")]
    ages = {n.name: n.preflight_age_s(ctx.now) for n in nodes}
    if not nodes or any(age is None or age > max_age for age in ages.values()):
        return False
    ages = {name: round(age, 3) for name, age in ages.items()}
    message = f"every node passed a preflight check within {max_age:g} s"
    report = {"ok": True, "skipped": True, "message": message, "passed_s_ago": ages,
              "max_age_s": max_age}
    JobAttempt.objects.filter(pk=attempt.pk).update(preflight=report)
    attempt.preflight = report
    ctx.job.record("PreflightSkipped", message, attempt=attempt, now=ctx.now, evidence=ages)
    return True


def _swap_failed_node(ctx: Ctx, attempt: JobAttempt, name: str,
                      result: PreflightResult) -> bool:
    job = ctx.job
    placement = attempt.placements.select_related("node").get(node__name=name)
    bad = placement.node
    evidence = {"preflight": result.node_check(name),
                "message": result.message, "attempt": attempt.id}
    cordon_with_evidence(bad, f"failed the preflight check: {result.message}", evidence,
                         ctx.now, health_kind=NodeHealthEvent.Kind.NCCL_TEST)
    # A suspect of the job's last failure, checked for it: its loss counts
    # against what the job's failures may cost the fleet.
    recovery_evidence.charge_check(ctx, name)
    job.record("PreflightFailed", f"{name} failed the preflight check", attempt=attempt,
               now=ctx.now, evidence={"node": name, **evidence})
    with transaction.atomic():
        Cluster.objects.select_for_update(no_key=True).get(pk=ctx.cluster.pk)
        in_attempt = set(attempt.placements.values_list("node_id", flat=True))
        choices = [n for n in free_nodes(ctx) if n.id not in in_attempt]
        # The cordon left a vacancy: filled now (a spare that names it), not
        # at the cluster's next pass; taken here only when no working node is free.
        fill_vacancies(ctx.pool, ctx.now, first=bad)
        if not choices:
            choices = [n for n in free_nodes(ctx) if n.id not in in_attempt]
        if not choices:
            return False
        replacement = choices[0]
        AttemptNode.objects.filter(pk=placement.pk).update(node=replacement)
    job.record("NodeSwapped", f"{replacement.name} takes {name}'s place", attempt=attempt,
               now=ctx.now, evidence={"old": name, "new": replacement.name})
    return True


def trainer_config(job: TrainingJob) -> dict:
    """The job's hyperparameters in the trainer's field names (trainer/config.py)."""
    config = dict(job.hyperparameters or {})
    config["strategy"] = job.strategy
    config["checkpoint_every_steps"] = job.effective_checkpoint_every
    config["keep_last"] = job.keep_last
    return config


def _launch(ctx: Ctx, attempt: JobAttempt) -> None:
    job = ctx.job
    checkpoint, by_person = resume.checkpoint_for(ctx, attempt)
    token = issue_token(attempt)
    # An eval run reads its parent's storage (and writes nothing there).
    storage_job = job.parent if job.is_eval else job
    env = {
        **(job.env or {}),  # the job's own; the launch contract's names below win
        contract.URL: settings.PUBLIC_URL,
        contract.TOKEN: token,
        contract.JOB_ID: str(job.id),
        contract.ATTEMPT_ID: str(attempt.id),
        contract.CHECKPOINT_URI: job_checkpoint_uri(storage_job),
        contract.RESUME_STEP: str(checkpoint.step) if checkpoint else contract.RESUME_NONE,
        # The exact folder, so a program without the SDK needs no lookup.
        contract.RESUME_URI: checkpoint.uri if checkpoint else "",
        contract.CHECKPOINT_EVERY: str(job.effective_checkpoint_every),
        contract.CONFIG: json.dumps(trainer_config(job), sort_keys=True),
    }
    if job.is_eval:
        env[contract.EVAL_STEP] = str(job.eval_step)
        env[contract.PARENT_JOB_ID] = str(job.parent_id)
    placements = _placements(attempt)
    request = LaunchRequest(
        job_id=job.id, attempt_id=attempt.id, attempt_number=attempt.number,
        name=f"job-{job.id}-a{attempt.number}", pool=ctx.pool_info, placements=placements,
        nproc_per_node=job.gpus_per_node, image=job.image, command=_command(job),
        env=env, checkpoint_uri=env[contract.CHECKPOINT_URI], team=job.team.name,
        avoid_nodes=_avoid(ctx),
    )
    # Launching on a job another worker has taken since would double the gang.
    locks.ensure_held()
    # The provider hands back the ranks a pass that died here had started;
    # the token above is theirs too, so their reports are accepted.
    ref = ctx.provider.launch(request)
    signals.launch_point.send(TrainingJob, point="launched", job_id=job.id)
    # What the launch means, written at once: no reader (the job page, a
    # test, the next pass) sees the attempt started without the job's
    # Launched, or the resume it started from.
    with transaction.atomic():
        # Started now, not when the pass began: the start-up deadlines count
        # from here, and a preflight before it may have taken half a minute.
        attempt.launched(event_time(ctx.now), provider_ref=ref, resumed_from=checkpoint,
                         resume_step=checkpoint.step if checkpoint else None)
        if by_person:
            # restart_from_step is spec and stays; this note says it was honoured,
            # and where the new branch starts.
            branch = checkpoint.step if checkpoint else 0
            ctx.set_condition("RestartFromStep", generation=job.generation,
                              step=job.restart_from_step, attempt=attempt.number,
                              branch_step=branch)
            abandon_branch(job, branch, attempt.number, ctx.now)
        ctx.clear_condition("RestartBackoff")
        nodes = [p.node for p in placements]
        # Recorded again at the launch: a preflight swap may have moved a rank.
        placed = placement.describe([p.node for p in attempt.placements.select_related("node")],
                                    ctx.pool.topology_label)
        JobAttempt.objects.filter(pk=attempt.pk).update(placement=placed)
        # A provider that started a node from a warm standby says so in its
        # reference (`nodes[].warm`, the local provider): shown, so a quick or
        # a slow start-up on the timeline has its reason beside it.
        warm = sorted(n["node"] for n in ref.get("nodes") or ()
                      if isinstance(n, dict) and n.get("warm"))
        job.transition(
            Phase.STARTING, reason="Launched", attempt=attempt, now=ctx.now,
            message=f"attempt {attempt.number} on {', '.join(nodes)}"
                    + (f" (warm standby on {len(warm)} of {len(nodes)})" if warm else ""),
            evidence={"attempt": attempt.number, "nodes": nodes, "placement": placed,
                      "resume_step": checkpoint.step if checkpoint else None,
                      "warm_nodes": warm},
            pending_reason="",
            started_at=job.started_at or ctx.now,
        )
        if checkpoint is not None:
            resume.record(ctx, attempt, checkpoint, by_person)


def _command(job: TrainingJob) -> tuple[str, ...]:
    """The program and its arguments; empty runs the built-in trainer."""
    if not job.entrypoint:
        return ()
    return (*job.entrypoint, *(job.args or ()))
