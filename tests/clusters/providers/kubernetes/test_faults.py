"""The Kubernetes provider when the cluster misbehaves, on the real test
cluster (tests/support/kube_cluster.py): an API server stalled (SIGSTOP of
its process), a kubelet that cannot be reached for a pod's log, a node
deleted under a running rank, a ResourceQuota that refuses the pods, an
admin's cordon, a node NotReady twice; and what the informers save.

Everything here is the real API server and controllers; the one fake is
tests/support/pod_logs.py, a container's output (kwok runs no container).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.providers.base import Placement
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes.informers import ClusterCache
from clusters.providers.kubernetes.observe import CORDONED_BY_REGATTA
from clusters.providers.kubernetes.reachability import request_timeout
from clusters.reconcile import reconcile_cluster_unlocked
from clusters.reconcile.follow import HELD
from clusters.reconcile.returns import request_return
from controlplane.lib import locks, runner
from jobs.models import Phase
from jobs.reconcile import JOBS
from testcluster import bootstrap
from testcluster.fleet import node_manifest
from tests.fleet_helpers import later
from tests.support.kube_calls import Recorder
from tests.support.kube_cluster import TRAINING_NS
from tests.support.pod_logs import PodLogs
from tests.support.waiting import eventually

from .test_manifests import make_pool, make_request
from .test_provider import launch_running, ranks
from .test_real_cluster import gpu_pool, kube_cluster, running_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS = TRAINING_NS
SELECTOR = f"{mf.MANAGED_BY}={mf.MANAGER}"


@pytest.fixture
def cached(kube_world):
    """A provider with informers of its own (as for_cluster gives one), its
    requests recorded; the informers stop after the test."""
    calls = Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))
    settings = KubeSettings.parse({"request_timeout_s": 10})
    cache = ClusterCache(calls.api, NS, SELECTOR, request_timeout(10))
    provider = KubernetesProvider(calls.api, settings, sleep=lambda s: None, cache=cache)
    provider.calls = calls
    yield provider
    cache.stop()


def kwok_pool(world, size=3, **kw):
    pool = world.make_pool(size=size, **kw)
    return pool, make_pool(name=pool.name, node_selector=pool.selector)


def request_on(pool, info, **kw):
    return make_request(nodes=tuple(pool.node_name(i) for i in range(pool.size)), pool=info,
                        **kw)


# --- 2. logs -------------------------------------------------------------------------

def test_a_log_the_api_server_cannot_fetch_is_noted_not_raised(kube_world, cached):
    """pods/log goes through the API server to the node's kubelet, which a
    kwok node has none of: the server answers an error, as for a kubelet
    that cannot be reached. The read says so and raises nothing, so a
    failure (observe's log tails) or a preflight acts with what it knows."""
    pool, info = kwok_pool(kube_world, size=1)
    ref, pods = launch_running(kube_world, cached, request_on(pool, info))
    started = time.monotonic()
    text, unreachable = cached.read_log(ranks(pods)[0].metadata.name, mf.CONTAINER, 40)
    assert time.monotonic() - started < 25
    assert text == "" and unreachable.startswith("(log unreachable"), unreachable


def test_a_log_of_one_json_line_reads_back_as_that_line(kube_world):
    provider = KubernetesProvider(bootstrap.api_client(kube_world.regatta_kubeconfig),
                                  KubeSettings(request_timeout_s=10))
    line = '{"level": "error", "msg": "CUDA out of memory", "rank": 3}'
    PodLogs({(NS, "rank-3"): line + "\n"}).install(provider)
    text, unreachable = provider.read_log("rank-3", "pytorch", tail_lines=40)
    assert (text, unreachable) == (line + "\n", "")


# --- 3. a lost node ------------------------------------------------------------------

def test_a_rank_whose_node_is_deleted_is_lost_on_the_node_it_ran_on(kube_world, cached):
    pool, info = kwok_pool(kube_world, size=2)
    ref, pods = launch_running(kube_world, cached, request_on(pool, info))
    worker = ranks(pods)[1]
    where = worker.spec.node_name
    kube_world.core.delete_node(where)

    def lost():
        found = {n.node_rank: n for n in cached.observe(ref).nodes}
        return found[1] if found[1].node_lost else None

    proc = eventually(lost, timeout=10, interval=0.2, what="the rank to be read as lost")
    assert proc.node == where and not proc.running and proc.signal == 9
    assert where in proc.node_lost

    # As the pod GC would, a minute later: the pod goes. The operator then
    # makes it again (Pending: its node is gone), or, once it has read the
    # job as failed, leaves it gone. Either way: still that rank, lost there.
    kube_world.core.delete_namespaced_pod(worker.metadata.name, NS, grace_period_seconds=0)

    def operator_done():
        again = [p for p in kube_world.pods(f"{mf.OPERATOR_JOB_LABEL}={ref['name']}")
                 if p.metadata.name == worker.metadata.name]
        if any(p.metadata.uid != worker.metadata.uid for p in again):
            return "re-created"
        conditions = ((kube_world.pytorchjob(ref["name"]) or {}).get("status") or {}).get(
            "conditions") or []
        failed = any(c.get("type") == "Failed" and c.get("status") == "True"
                     for c in conditions)
        return "left gone" if failed and not again else None

    # The operator acts at once or at its next resync, a minute on; a loaded
    # machine adds to that.
    eventually(operator_done, timeout=150, interval=0.2,
               what="the operator to make the pod again or to fail the job")
    proc = lost()
    assert proc is not None and proc.node == where
    status = cached.observe(ref)
    assert status.state == "failed"


def test_a_preflight_runs_beside_the_pass(kube_world, cached):
    pool, info = kwok_pool(kube_world, size=2)
    placements = (Placement(pool.node_name(0), 0), Placement(pool.node_name(1), 1))
    started = time.monotonic()
    first = cached.preflight(info, placements, timeout_s=60)
    assert first.pending and time.monotonic() - started < 5
    name = first.evidence["job"]
    again = eventually(lambda: cached.preflight(info, placements, timeout_s=60)
                       if kube_world.pytorchjob(name) else None, timeout=10, interval=0.2)
    assert again.pending and again.evidence["job"] == name  # the same check, found again


# --- 4. pods the controller cannot create -------------------------------------------------

@pytest.fixture
def no_gpu_quota(kube_world):
    kube_world.core.create_namespaced_resource_quota(NS, {
        "metadata": {"name": "no-gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}})
    yield
    kube_world.core.delete_namespaced_resource_quota("no-gpus", NS)


@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
def test_a_quota_that_refuses_the_pods_is_a_wait_in_the_api_servers_words(
        kube_world, no_gpu_quota, job_api):
    calls = Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))
    cache = ClusterCache(calls.api, NS, SELECTOR, request_timeout(10))
    try:
        provider = KubernetesProvider(calls.api, KubeSettings.parse(
            {"request_timeout_s": 10, "job_api": job_api}), cache=cache)
        pool, info = kwok_pool(kube_world, size=2)
        ref = provider.launch(request_on(pool, info))

        def refused():
            status = provider.observe(ref)
            return status if any("exceeded quota" in i.message for i in status.waits) else None

        status = eventually(refused, timeout=60, interval=0.5,
                            what="the controller's refusal to be read")
        assert status.state == "running" and not status.failed_nodes
        (issue, *_) = [i for i in status.waits if "exceeded quota" in i.message]
        assert "no-gpus" in issue.message and issue.node_rank is None
    finally:
        cache.stop()


# --- 5. Guaranteed QoS --------------------------------------------------------------------

def test_every_pod_of_a_pytorchjob_is_guaranteed(kube_world, cached):
    pool, info = kwok_pool(kube_world, size=2)
    ref, pods = launch_running(kube_world, cached, request_on(pool, info))
    by_rank = ranks(pods)
    assert by_rank[1].spec.init_containers, "the operator adds init-pytorch to Workers"
    assert {r: p.status.qos_class for r, p in by_rank.items()} == {0: "Guaranteed",
                                                                   1: "Guaranteed"}


# --- 6. informers ---------------------------------------------------------------------------

def test_nodes_are_listed_once_then_watched(kube_world, cached):
    pool, info = kwok_pool(kube_world, size=2)
    assert {n.name for n in cached.list_nodes(info)} == {pool.node_name(0), pool.node_name(1)}
    for _ in range(5):
        cached.list_nodes(info)
        cached.health_signals(info)
    lists = [c for c in cached.calls.calls("GET", "/api/v1/nodes")
             if c.query.get("watch") != "True"]
    assert len(lists) == 1, [c.query for c in lists]
    # A node added is seen from the watch, with no list.
    kube_world.core.create_node(node_manifest(pool, 2))
    kube_world.made_nodes.append(pool.node_name(2))
    eventually(lambda: len(cached.list_nodes(info)) == 3, timeout=10, interval=0.1,
               what="the new node to come on the watch")
    assert len([c for c in cached.calls.calls("GET", "/api/v1/nodes")
                if c.query.get("watch") != "True"]) == 1


# --- node states as Kubernetes shows them ----------------------------------------

def test_an_admins_cordon_is_a_hold_and_regattas_own_is_not(kube_world, cached):
    pool, info = kwok_pool(kube_world, size=2)
    mine, theirs = pool.node_name(0), pool.node_name(1)
    cached.cordon(info, mine)
    kube_world.core.patch_node(theirs, {"spec": {"unschedulable": True}})

    def holds():
        found = {n.name: n for n in cached.list_nodes(info)}
        if not (found[mine].unschedulable and found[theirs].unschedulable):
            return None
        return {name: n.admin_hold for name, n in found.items()}

    seen = eventually(holds, timeout=10, interval=0.1)
    assert seen[mine] == "" and seen[theirs].startswith("cordoned in Kubernetes")
    assert kube_world.core.read_node(mine).metadata.annotations[CORDONED_BY_REGATTA] == "true"
    # Regatta does not take the admin's cordon for its own, nor lift it.
    cached.uncordon(info, theirs)
    assert kube_world.core.read_node(theirs).spec.unschedulable is True
    cached.uncordon(info, mine)
    node = kube_world.core.read_node(mine)
    assert not node.spec.unschedulable
    assert CORDONED_BY_REGATTA not in (node.metadata.annotations or {})


def test_a_cordon_regatta_made_before_it_marked_them_is_its_own_not_an_admins(
        db, kube_world, fsx):
    """Nodes Regatta cordoned before it marked its cordons carry no mark: one
    whose row says Regatta took it out is Regatta's (marked now, lifted by
    its return to service), while an admin's cordon of a node in service is
    still theirs."""
    pool = gpu_pool(kube_world, size=2)
    cluster = kube_cluster(kube_world, pool, fsx)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    ours, theirs = pool.node_name(0), pool.node_name(1)
    # As an earlier Regatta did: the row cordoned on evidence, and the Node
    # patched with spec.unschedulable alone.
    row = Node.objects.get(cluster=cluster, name=ours)
    assert row.transition(Node.State.CORDONED, reason="lost: not ready for 31 s",
                          now=later(now, 1), evidence={"not_ready_for_s": 31})
    kube_world.core.patch_node(ours, {"spec": {"unschedulable": True}})
    kube_world.core.patch_node(theirs, {"spec": {"unschedulable": True}})  # kubectl cordon

    def followed():
        reconcile_cluster_unlocked(cluster.id, later(now, 2))
        held = Node.objects.get(cluster=cluster, name=theirs)
        marked = kube_world.core.read_node(ours).metadata.annotations or {}
        return held if held.admin_hold and CORDONED_BY_REGATTA in marked else None

    held = eventually(followed, timeout=30, interval=0.5, what="the pass to follow both")
    assert held.state == Node.State.CORDONED and held.state_reason.startswith(HELD)
    assert CORDONED_BY_REGATTA not in (kube_world.core.read_node(theirs).metadata.annotations
                                       or {})
    row.refresh_from_db()
    assert row.admin_hold == "" and row.state == Node.State.CORDONED
    assert not row.events.filter(reason__startswith=HELD).exists()

    # Its return lifts Regatta's cordon; the admin's stays as it is.
    assert request_return(row, actor="user:alice", reason="mended", now=later(now, 3))

    def returned():
        reconcile_cluster_unlocked(cluster.id, later(now, 4))
        row.refresh_from_db()
        return row.state == Node.State.READY

    eventually(returned, timeout=30, interval=0.5, what="the node to return to service")
    node = kube_world.core.read_node(ours)
    assert not node.spec.unschedulable
    assert CORDONED_BY_REGATTA not in (node.metadata.annotations or {})
    assert kube_world.core.read_node(theirs).spec.unschedulable is True


def test_not_ready_is_a_state_not_a_lost_signal_and_health_keys_last_across_spells(
        kube_world, cached):
    pool, info = kwok_pool(kube_world, size=1, labels={"example.com/dcgm": "pass"})
    node = pool.node_name(0)
    settings = KubeSettings.parse({"request_timeout_s": 10,
                                   "health_labels": {"example.com/dcgm": "pass"}})
    provider = KubernetesProvider(cached.core.api_client, settings, cache=cached.reads.cache)
    kube_world.fleet.make_not_ready(node)

    def not_ready():
        (info_,) = provider.list_nodes(info)
        return info_ if not info_.ready else None

    seen = eventually(not_ready, timeout=30, interval=0.2, what="the node to turn NotReady")
    assert seen.conditions["Ready"] in ("False", "Unknown")
    assert [s for s in provider.health_signals(info) if s.kind == "lost"] == []

    keys = []
    for value in ("ecc-dbe", "pass", "ecc-dbe"):
        kube_world.core.patch_node(node, {"metadata": {"labels": {"example.com/dcgm": value}}})
        eventually(lambda v=value: provider.list_nodes(info)[0].labels["example.com/dcgm"] == v,
                   timeout=10, interval=0.1)
        keys.append([(s.key, s.continuous) for s in provider.health_signals(info)])
    assert keys[0] == keys[2] == [(f"{node}/label/example.com/dcgm=ecc-dbe", True)]
    assert keys[1] == []


# --- 7. a stalled API server ------------------------------------------------------------
# Last in the file: the controllers' own watches (the operator's, kwok's)
# may take a while to recover from a stalled API server, and the tests
# after it would wait on them.

def in_thread(fn, *args):
    out = {}

    def run():
        started = time.monotonic()
        try:
            out["result"] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - looked at by the test
            out["error"] = exc
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_stalled_api_server_fails_passes_fast_and_the_job_goes_on(db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx, pool_size=2, nodes=2)
    Cluster.objects.filter(pk=job.cluster_id).update(
        settings={**job.cluster.settings, "request_timeout_s": 3})
    apiserver = kube_world.cluster.running()["kube-apiserver"]
    job.request_cancel("alice", now=later(now, 1))
    os.kill(apiserver, signal.SIGSTOP)
    try:
        took = []
        for i in range(3):
            thread, out = in_thread(runner.run, JOBS, job.id, later(now, 2 + i))
            thread.join(timeout=40)
            assert not thread.is_alive(), "a pass waited on the stalled API server"
            took.append(out["seconds"])
            # The pass ended as temporary, its lock released with it.
            assert "error" not in out, out.get("error")
            assert not locks.is_held(f"job:{job.id}")
        job.refresh_from_db()
        assert job.phase != Phase.CANCELLED
        # One request's timeout at most (a connect and a read), then the
        # server is counted away and the next passes fail at once.
        assert took[0] < 3 * 3 + 3, took
        assert max(took[1:]) < 2, took
    finally:
        os.kill(apiserver, signal.SIGCONT)

    def cancelled():
        runner.run(JOBS, job.id, later(now, 60))
        job.refresh_from_db()
        return job.phase == Phase.CANCELLED

    eventually(cancelled, timeout=90, interval=1, what="the cancel to go through")
    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="the PyTorchJob to go")
