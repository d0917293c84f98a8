"""Standby pods on Kubernetes spares (clusters/providers/kubernetes/
capacity.py), on the real test cluster: the cluster pass keeps one on each
ready spare, bound by the real scheduler with the PriorityClass deploy/base
ships; a relaunch onto the spare replaces it with the training pod; and a
training pod that lands on a spare before its standby is deleted preempts
it. kwok runs no containers, so the image pull and the warm page cache a
standby buys on a real node are not seen here, only the pods' lifecycle.
"""

from __future__ import annotations

import pytest
from django.utils import timezone
from kubernetes import client as k8s

from clusters.models import Node, NodePool
from clusters.providers.kubernetes import capacity
from clusters.providers.kubernetes.manifests import GPU, GPU_TOLERATION, HOSTNAME
from clusters.providers.registry import get_provider, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import heartbeat, later, launch, submit, team_with_quota
from tests.support.kube_cluster import TRAINING_NS
from tests.support.waiting import eventually

from .test_real_cluster import (
    OPERATOR_JOB_LABEL,
    gpu_pool,
    kube_cluster,
    running_pods,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STANDBYS = "regatta.io/purpose=standby"


def standby_on(world, node):
    """The standby pod that stands for `node`, once the scheduler has bound
    it there and kwok runs it; else None."""
    pods = world.pods(f"{STANDBYS},{capacity.LABEL_STANDBY_FOR}={node}")
    if len(pods) == 1 and pods[0].spec.node_name == node and pods[0].status.phase == "Running":
        return pods[0]
    return None


def pool_with_a_spare(world, fsx):
    pool = gpu_pool(world, size=3)
    cluster = kube_cluster(world, pool, fsx)
    NodePool.objects.filter(cluster=cluster).update(size=2, spare_count=1)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    spare = Node.objects.get(cluster=cluster, is_spare=True, state=Node.State.READY).name
    return pool, cluster, spare, now


def test_a_spare_keeps_a_standby_pod_until_a_relaunch_takes_the_node(db, kube_world, fsx):
    pool, cluster, spare, now = pool_with_a_spare(kube_world, fsx)

    pod = eventually(lambda: standby_on(kube_world, spare), timeout=30, interval=0.2,
                     what="the spare's standby pod to run there")
    container = pod.spec.containers[0]
    assert container.image == "regatta/trainer:latest"  # the preflight image, by default
    assert container.resources.requests[GPU] == str(pool.gpus)  # the node's GPUs held
    assert pod.spec.priority_class_name == "regatta-standby" and pod.spec.priority == -10
    assert [p.metadata.name for p in kube_world.pods(STANDBYS)] == [pod.metadata.name]
    reconcile_cluster_unlocked(cluster.id, later(now, 1))
    assert standby_on(kube_world, spare).metadata.uid == pod.metadata.uid  # held, not remade

    # A job on the two working nodes; one of them fails.
    team = team_with_quota(cluster, gpus=8 * 3)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"))
    launch(job, later(now, 2))
    first = job.attempts.get()
    assert spare not in set(first.placements.values_list("node__name", flat=True))
    eventually(lambda: running_pods(kube_world, first.provider_ref["name"], 2), timeout=60,
               interval=0.2, what="the first attempt's pods to run")
    heartbeat(first, 1, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 6))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.last_error
    bad = first.placements.get(node_rank=1).node.name
    kube_world.fleet.make_not_ready(bad)
    eventually(lambda: not kube_world.fleet.ready(bad), timeout=30, interval=0.2,
               what="kwok to report the node NotReady")

    # A pass sees it not ready; a pass past the cluster's grace fails it,
    # and the job acts on the `lost` event.
    went = later(now, 8)

    def noted():
        reconcile_cluster_unlocked(cluster.id, went)
        return Node.objects.get(name=bad).not_ready_since == went

    eventually(noted, timeout=10, interval=0.2, what="the pass to see the node not ready")
    failed_at = later(went, cluster.config.node_failure_grace_s + 1)
    reconcile_cluster_unlocked(cluster.id, failed_at)
    heartbeat(first, 2, failed_at)
    reconcile_job_unlocked(job.id, later(failed_at, 1))
    now = later(failed_at, -8)  # the passes below come after these

    second = job.attempts.get(number=2)
    placed = set(second.placements.values_list("node__name", flat=True))
    assert spare in placed and bad not in placed
    # The launch deleted the standby first: the training pod takes its GPUs
    # at once, without waiting on a preemption.
    pods = eventually(lambda: running_pods(kube_world, second.provider_ref["name"], 2),
                      timeout=60, interval=0.2, what="the relaunch's pods to run")
    assert {p.spec.node_name for p in pods} == placed
    assert kube_world.pods(f"{STANDBYS},{capacity.LABEL_STANDBY_FOR}={spare}") == []
    # A promoted spare is a spare no more: the next pass does not hold it again.
    reconcile_cluster_unlocked(cluster.id, later(now, 10))
    assert kube_world.pods(f"{STANDBYS},{capacity.LABEL_STANDBY_FOR}={spare}") == []
    assert kube_world.pods(f"{OPERATOR_JOB_LABEL}={second.provider_ref['name']}")


def test_a_training_pod_that_lands_on_a_held_spare_preempts_its_standby(db, kube_world, fsx):
    """Whatever the order of a launch and a cluster pass, a standby never
    keeps a training pod from its node: the real scheduler preempts it (its
    PriorityClass is below a pod of no class). And a spare that is no
    longer one loses its standby at the next hold."""
    pool, cluster, spare, _ = pool_with_a_spare(kube_world, fsx)
    standby = eventually(lambda: standby_on(kube_world, spare), timeout=30, interval=0.2,
                         what="the spare's standby pod to run there")

    pinned = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
            node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=[
                k8s.V1NodeSelectorRequirement(key=HOSTNAME, operator="In", values=[spare])])])))
    kube_world.core.create_namespaced_pod(TRAINING_NS, k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="a-training-pod", labels={"test": "preempts"}),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="rank", image="registry.example/trainer:2.1",
                                        resources=k8s.V1ResourceRequirements(
                                            limits={GPU: str(pool.gpus)}))],
            tolerations=[k8s.V1Toleration(**GPU_TOLERATION)], affinity=pinned)))

    eventually(lambda: [p for p in kube_world.pods("test=preempts")
                        if p.spec.node_name == spare and p.status.phase == "Running"],
               timeout=60, interval=0.2, what="the training pod to preempt the standby and run")
    assert all(p.metadata.uid != standby.metadata.uid for p in kube_world.pods(STANDBYS))

    provider = get_provider(cluster)
    provider.hold_spares(pool_info(NodePool.objects.get(cluster=cluster)), [])
    eventually(lambda: kube_world.pods(STANDBYS) == [], timeout=30, interval=0.2,
               what="no standby pod once the pool has no spare")
