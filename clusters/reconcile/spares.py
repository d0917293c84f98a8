"""Spares are checked when they join, not when they are needed.

A launch skips its preflight when every chosen node passed one recently
(jobs/reconcile/launch.py), so recovery from a failed node does not wait for
a check: the survivors passed at the launch before, and the spare promoted in
the failed node's place passed here, while it waited. A spare that fails is
cordoned with the evidence; it is never promoted, and `keep_spares`
provisions another in its place.

One spare per cluster pass: a check may take as long as
`preflight_timeout_s`, and the pass holds the cluster's lock meanwhile.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db.models import Q

from clusters.models import Node, NodeEvent, NodeHealthEvent
from clusters.providers import Placement, PreflightResult, pool_info
from controlplane.lib import locks
from controlplane.lib.errors import PermanentError, TemporaryError

from .. import wake
from ..workload import jobs_on_node
from . import check_verdict
from .replacement import cordon_with_evidence

log = logging.getLogger(__name__)


def unchecked_spares(pool, now, max_age_s: float):
    """Ready spares of the pool with no pass within `max_age_s`, oldest first."""
    stale = now - timedelta(seconds=max_age_s)
    return (
        Node.objects.filter(pool=pool, is_spare=True, state=Node.State.READY)
        .filter(Q(preflight_passed_at__isnull=True) | Q(preflight_passed_at__lt=stale))
        .order_by("created_at", "id")
    )


def check_one_spare(cluster, pools, provider, now) -> Node | None:
    """Run a single-node preflight on the first ready spare of `pools` that
    has no recent pass; return the spare checked (None if none was)."""
    cfg = cluster.config
    if not cfg.preflight_on or check_verdict.check_suspect(cluster, now) is not None:
        return None  # off, or failing everywhere alike: checking spares proves nothing
    max_age = cfg.preflight_max_age_s
    for pool in pools:
        spare = unchecked_spares(pool, now, max_age).first()
        if spare is None:
            continue
        placement = Placement(node=spare.name, node_rank=0, provider_id=spare.provider_id,
                              address=spare.address)
        try:
            result = provider.preflight(pool_info(pool), (placement,),
                                        timeout_s=cfg.preflight_timeout_s)
        except (PermanentError, TemporaryError) as exc:
            log.warning("cluster %s: preflight of spare %s not run: %s",
                        cluster.name, spare.name, exc)
            return None
        if result.pending:
            return None  # the check runs beside the pass; a later pass reads it
        # The check may have taken a while: act on it only if the cluster is still ours.
        locks.ensure_held()
        verdict = check_verdict.judge(cluster, result, [spare.name], now)
        _settle(spare, result, now, blamed=spare.name in verdict.blamed)
        return spare
    return None


def _settle(spare: Node, result: PreflightResult, now, *, blamed: bool = True) -> None:
    check = result.node_check(spare.name)
    if result.ok:
        if Node.objects.filter(pk=spare.pk, state=Node.State.READY).update(
                preflight_passed_at=now):
            NodeEvent.objects.create(
                node=spare, from_state=Node.State.READY, to_state=Node.State.READY,
                reason="passed its preflight check on joining",
                evidence={"preflight": check, "message": result.message}, created_at=now,
            )
        return
    if spare.name not in result.failed_nodes or not blamed:
        # A check that blames no node (it timed out whole), or that fails on
        # every node alike (check_verdict.py), proves nothing either way: no
        # pass is stamped, and the spare stays.
        log.warning("preflight of spare %s failed without telling it apart: %s",
                    spare.name, result.message)
        return
    evidence = {"preflight": check, "message": result.message, "when": "joining"}
    reason = f"failed its preflight check on joining: {result.message}"
    job_ids = jobs_on_node(spare.id)
    if job_ids:
        # A job took the spare while it was being checked: the job acts on the
        # open critical event as on any other hardware failure under it.
        NodeHealthEvent.objects.create(
            node=spare, kind=NodeHealthEvent.Kind.NCCL_TEST,
            severity=NodeHealthEvent.Severity.CRITICAL, message=reason[:500],
            evidence=evidence, created_at=now,
        )
        wake.jobs(job_ids)
        return
    cordon_with_evidence(spare, reason, evidence, now, health_kind=NodeHealthEvent.Kind.NCCL_TEST)
