"""The parts the Kubernetes provider is assembled from (client.py): the job
API (pytorchjob_calls.py, trainjob_calls.py), the queue (queues.py) and,
per pool, the node source (node_sources.py). Each is chosen by the settings,
and each is driven alone here against the real test cluster
(tests/support/kube_cluster.py): the training-operator, the Trainer and
JobSet, Kueue, the scheduler and kwok nodes."""

from __future__ import annotations

import pytest

from clusters.providers.kubernetes import KubernetesProvider, KubeSettings, capacity
from clusters.providers.kubernetes.node_sources import (
    AutoScalingGroup,
    FixedPool,
    Karpenter,
)
from clusters.providers.kubernetes.pytorchjob_calls import PyTorchJobCalls
from clusters.providers.kubernetes.queues import Kueue, NoQueue, Volcano
from clusters.providers.kubernetes.trainjob_calls import TrainJobCalls
from controlplane.lib.errors import PermanentError
from testcluster import bootstrap
from tests.support.waiting import eventually

from .test_karpenter import PlayKarpenter, capacity_pods, karpenter_kwok_pool
from .test_manifests import make_pool
from .test_provider import kwok_pool, request_on

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def provider_with(world, **settings) -> KubernetesProvider:
    return KubernetesProvider(bootstrap.api_client(world.regatta_kubeconfig),
                              KubeSettings.parse({"request_timeout_s": 10, **settings}),
                              sleep=lambda s: None)


def test_the_provider_is_assembled_from_its_settings(kube_world):
    plain = provider_with(kube_world)
    assert type(plain.jobs) is PyTorchJobCalls and type(plain.queue) is NoQueue
    v2 = provider_with(kube_world, job_api="trainjob", gang_scheduler="kueue", queue="q")
    assert type(v2.jobs) is TrainJobCalls and type(v2.queue) is Kueue
    assert v2.jobs.queue is v2.queue
    assert type(provider_with(kube_world, gang_scheduler="volcano", queue="q").queue) is Volcano
    # An attempt is observed by the kind it was made as, whatever the setting now.
    assert plain.job_api_of({"kind": "TrainJob", "name": "x"}) is plain.job_apis["TrainJob"]
    assert v2.job_api_of({"name": "x"}) is v2.job_apis["PyTorchJob"]
    sources = {type(plain.node_source(make_pool(settings=s))) for s in (
        {}, {"asg_name": "h100-group"}, {"node_autoscaler": "karpenter"})}
    assert sources == {FixedPool, AutoScalingGroup, Karpenter}


@pytest.mark.parametrize("api", [PyTorchJobCalls, TrainJobCalls])
def test_a_job_api_part_launches_observes_and_stops_its_kind(kube_world, api):
    pool, info = kwok_pool(kube_world, size=2)
    provider = provider_with(kube_world)
    part = api(provider, NoQueue())

    ref = part.launch(request_on(pool, info, name=f"parts-{api.kind.name.lower()}"))

    made = part.get(ref["name"])
    assert made["kind"] == api.kind.name and made["metadata"]["uid"] == ref["uid"]
    # A pod not bound yet counts as running, reported on its planned node; the
    # Job controller may give either index to either node, so a rank whose pod
    # is still unbound (the binding can lag on a loaded host) may be reported
    # on its peer's node. Bound, the pods stand on two nodes (one per node).
    status = eventually(lambda: (s := part.observe(ref)).state == "running"
                        and len(s.nodes) == 2 and all(n.running for n in s.nodes)
                        and len({n.node for n in s.nodes}) == 2 and s,
                        timeout=60, interval=0.2, what="the gang's pods to run")
    assert {n.node for n in status.nodes} == {pool.node_name(0), pool.node_name(1)}
    # The provider finds the part again by the attempt's reference.
    assert provider.job_api_of(ref) is provider.job_apis[api.kind.name]
    part.stop(ref, grace_s=0)
    eventually(lambda: part.get(ref["name"]) is None, timeout=60, interval=0.2,
               what="the stopped job to go")
    assert kube_world.core.list_namespaced_secret(
        provider.ns, field_selector=f"metadata.name={ref['secret']}").items == []


def test_the_queue_part_reads_what_holds_a_gang_back(kube_world):
    pool, info = kwok_pool(kube_world, size=2)
    queue = kube_world.make_queue(pool, gpus=8)
    provider = provider_with(kube_world, gang_scheduler="kueue", queue=queue)
    # 16 GPUs against a ClusterQueue of 8: Kueue suspends the job and holds
    # its Workload.
    ref = provider.launch(request_on(pool, info, name="parts-queued"))
    job = provider.jobs.get(ref["name"])
    uid = job["metadata"]["uid"]

    held = eventually(lambda: Kueue(provider.reads).holding(job)["workload"], timeout=60,
                      interval=0.5, what="Kueue's Workload of the job")

    assert held["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == uid
    assert NoQueue().holding(job) == {}
    # No Volcano in this cluster: its PodGroup is not there to read.
    assert Volcano(provider.reads).holding(job) == {"podgroup": None}
    provider.stop(ref)


def test_a_fixed_pool_asks_for_nothing_and_replaces_nothing(kube_world):
    pool, info = kwok_pool(kube_world, size=1)
    source = FixedPool(provider_with(kube_world))
    nodes = provider_with(kube_world).list_nodes(info)

    assert [n.name for n in nodes] == [pool.node_name(0)]
    assert source.coming(info, nodes) == []
    with pytest.raises(PermanentError, match="asg_name"):
        source.provision(info, "spare-1")
    with pytest.raises(PermanentError, match="replacing a node needs"):
        source.replace(info, pool.node_name(0))
    assert kube_world.fleet.ready(pool.node_name(0)), "the Node is left alone"
    assert source.scaling_status(info, None).settled
    assert source.release(info, pool.node_name(0), "aws:///us-east-1a/i-0") == ""


def test_a_karpenter_source_asks_with_a_pending_pod_and_frees_what_it_holds(kube_world):
    pool, info = karpenter_kwok_pool(kube_world, size=1)
    provider = provider_with(kube_world)
    source = Karpenter(provider)

    spare = source.provision(info, "spare-k")

    assert (spare.name, spare.ready) == ("spare-k", False)
    (pod,) = capacity_pods(kube_world)
    assert pod["metadata"]["labels"][capacity.LABEL_FOR] == "spare-k"
    assert [(n.name, n.ready) for n in provider.list_nodes(info)] == [
        (pool.node_name(0), True), ("spare-k", False)]
    assert not source.keeps_standbys
    # Karpenter (played here) brings up a node for the pending pod, which the
    # scheduler binds there: once an attempt is placed on that node, the
    # capacity pod gives its GPUs up.
    (joined,) = PlayKarpenter(kube_world, pool).launch_for_pending()
    source.free(info, {pool.node_name(0)})
    assert len(capacity_pods(kube_world)) == 1, "a node not placed on keeps its pod"
    source.free(info, {joined})
    eventually(lambda: capacity_pods(kube_world) == [], timeout=30, interval=0.2,
               what="the capacity pod to go")
