"""The two ways a pool ran over its size in chaos (issue 29), each as the
passes met it: one failure takes one spare, the pre-checked one, naming the
node it replaces; a spare that fails is replaced as a spare."""

import pytest
from django.utils import timezone

from clusters.models import Node
from clusters.providers import pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    later,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    running_job,
    submit,
    team_with_quota,
)

from .spare_invariants import PoolWatch

pytestmark = pytest.mark.usefixtures("fleet_dirs")

SIZE = 4


def test_a_node_reported_failed_before_its_job_claims_it_takes_one_spare(db):
    """Path (a): the cluster pass sees the provider report the node failed
    and fills its slot; the job's pass then claims the node and must take
    no second spare. (No grace: the pass that first sees it not ready
    fails it.)"""
    cluster = memory_cluster(size=SIZE, spares=2, node_failure_grace_s=0)
    pool = cluster.pools.get()
    checked = Node.objects.get(pool=pool, is_spare=True, preflight_passed_at__isnull=False)
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)
    first = job.attempts.get()
    heartbeat(first, 3, later(now, 1))
    victim = nodes_of(first)[0]
    watch = PoolWatch(pool)

    lose_node(cluster, victim, first.provider_ref)
    reconcile_cluster_unlocked(cluster.id, later(now, 2))
    watch.check("the cluster pass")
    reconcile_job_unlocked(job.id, later(now, 3))
    watch.check("the job pass")
    reconcile_cluster_unlocked(cluster.id, later(now, 4))
    watch.check("the next cluster pass")

    victim.refresh_from_db()
    assert victim.state == Node.State.REPLACED
    assert list(Node.objects.filter(replaces=victim)) == [checked]
    assert len(watch.working()) == SIZE
    second = job.attempts.get(number=2)
    assert checked in nodes_of(second)
    replaced = job.events.get(kind="NodeReplaced")
    assert replaced.evidence["new"] == checked.name


def test_a_spot_notice_on_an_idle_spare_replaces_it_as_a_spare(db):
    """Path (b): the notice claims the spare; nothing joins the working set."""
    cluster = memory_cluster(size=SIZE, spares=2)
    pool = cluster.pools.get()
    spare, other = Node.objects.filter(pool=pool, is_spare=True).order_by("name")
    watch = PoolWatch(pool)
    working = watch.working()
    now = timezone.now()

    provider_of(cluster).signal(pool_info(pool), spare.name, "spot_notice", severity="warning",
                                evidence={"action": "terminate",
                                          "time": later(now, 120).timestamp()})
    reconcile_cluster_unlocked(cluster.id, now)
    watch.check("the cluster pass")
    reconcile_cluster_unlocked(cluster.id, later(now, 1))
    watch.check("the next cluster pass")

    spare.refresh_from_db()
    other.refresh_from_db()
    assert spare.state == Node.State.REPLACED and spare.is_spare
    assert other.is_spare and other.state == Node.State.READY
    assert watch.working() == working
    assert not Node.objects.filter(replaces=spare).exists()
    # The provider's new machine joined as a spare: the pool keeps two.
    assert Node.objects.filter(pool=pool, is_spare=True, state="ready").count() == 2


def test_one_failure_leaves_the_pool_one_spare_over_nothing(db):
    """The promoted spare's place is refilled once: by the machine the
    provider brings in the failed node's stead, not by that and a freshly
    provisioned spare as well (a machine over, in the cloud a bill)."""
    cluster = memory_cluster(size=SIZE, spares=1)
    pool = cluster.pools.get()
    job = submit(cluster, team_with_quota(cluster))
    now = timezone.now()
    launch(job, now)
    first = job.attempts.get()
    heartbeat(first, 3, later(now, 1))
    watch = PoolWatch(pool)

    lose_node(cluster, nodes_of(first)[0], first.provider_ref)
    # The cluster pass sees the loss first (path (a)): it fills the slot and
    # tops the spares up before the job's pass claims the node and the
    # provider is asked to replace it.
    for step in range(2, 12):
        reconcile_cluster_unlocked(cluster.id, later(now, step))
        watch.check(f"cluster pass {step}")
        reconcile_job_unlocked(job.id, later(now, step))
        watch.check(f"job pass {step}")

    live = Node.objects.filter(pool=pool, state__in=("provisioning", "ready"))
    assert len(watch.working()) == SIZE
    assert live.filter(is_spare=True).count() == pool.spare_count
    assert live.count() == SIZE + pool.spare_count


def test_a_node_its_job_replaced_while_the_cluster_pass_read_it_stays_replaced(db, monkeypatch):
    """The cluster pass reads the pool's rows as it begins; the job's pass
    may cordon and replace a lost node before the cluster pass acts on
    what it read (Slurm: the provider calls the node DOWN as the job's pass
    takes it out). The node stays replaced, the pass goes on, and the
    failure takes one spare."""
    from clusters.reconcile import nodes as sync

    cluster = memory_cluster(size=SIZE, spares=2)
    now = timezone.now()
    job, first = running_job(cluster, team_with_quota(cluster), now)
    victim = nodes_of(first)[0]
    watch = PoolWatch(cluster.pools.get())
    lose_node(cluster, victim, first.provider_ref)

    read_rows = sync._keep_provider_status

    def job_pass_meanwhile(rows, reported):
        assert rows[victim.name]["state"] == Node.State.READY, "read before the job's pass"
        reconcile_job_unlocked(job.id, later(now, 2))
        read_rows(rows, reported)

    monkeypatch.setattr(sync, "_keep_provider_status", job_pass_meanwhile)
    reconcile_cluster_unlocked(cluster.id, later(now, 3))
    watch.check("the cluster pass after the job's")

    victim.refresh_from_db()
    assert victim.state == Node.State.REPLACED
    assert victim.failure_count == 1, "counted once, not again by the stale read"
    assert Node.objects.filter(replaces=victim).count() == 1
