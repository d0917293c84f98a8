"""A Karpenter pool: placement by the pool's labels, and capacity asked of
Karpenter the way it understands (a pending pod), so the pool keeps its size.

Fakes only for Kubernetes: no API server or Karpenter can run here, so
tests/support/k8s_standin.py serves the API over real HTTP on 127.0.0.1 and
`st.karpenter` plays Karpenter (a node for each pending pod that selects
the pool); the reconcilers run for real against PostgreSQL.
"""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings, capacity
from clusters.providers.kubernetes import manifests as mf
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
from tests.clusters.test_kubernetes_manifests import make_pool, make_request
from tests.fleet_helpers import later, launch, submit, team_with_quota
from tests.support import k8s_standin as st

NS = "regatta-training"
PODS = st.namespaced(NS, "pods")
POOL = {"karpenter.sh/nodepool": "h100"}


@pytest.fixture
def standin():
    with st.K8sStandIn() as server:
        yield server


def karpenter_pool(**kw):
    return make_pool(node_selector=POOL, settings={"node_autoscaler": "karpenter"}, **kw)


def test_a_karpenter_pool_selects_by_label_and_avoids_retired_nodes():
    request = make_request(pool=karpenter_pool(), avoid_nodes=("bad-1", "ip-10-0-0-2", "bad-0"))
    job = mf.to_dict(mf.pytorch_job(request, KubeSettings()))
    for replica in ("Master", "Worker"):
        spec = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]
        assert spec["nodeSelector"] == POOL
        affinity = spec["affinity"]["nodeAffinity"]
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        # A placed node is never avoided; no hostname is required.
        assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname",
                                             "operator": "NotIn", "values": ["bad-0", "bad-1"]}]
        (preferred,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred["weight"] == 100
        assert preferred["preference"]["matchExpressions"][0]["operator"] == "In"
    asg = mf.to_dict(mf.pytorch_job(make_request(avoid_nodes=("bad-0",)), KubeSettings()))
    pinned = asg["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["affinity"]
    (term,) = pinned["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"][0]["operator"] == "In"  # an ASG pool keeps its pin


def test_a_replaced_karpenter_node_asks_for_its_successor_once(standin):
    provider = KubernetesProvider(standin.api_client(), KubeSettings(request_timeout_s=5))
    standin.put(st.NODES, st.node("n1", labels=POOL))
    pool = karpenter_pool()
    assert provider.replace(pool, "n1") is None  # the successor joins later, by label
    provider.replace(pool, "n1")  # asked again: still one capacity pod
    assert standin.get(st.NODES, "n1") is None
    (pod,) = standin.store[PODS].values()
    assert pod["metadata"]["labels"]["regatta.io/purpose"] == "capacity"
    spec = pod["spec"]
    assert spec["nodeSelector"] == POOL and spec["terminationGracePeriodSeconds"] == 0
    assert spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert spec["containers"][0]["resources"]["requests"] == spec["containers"][0][
        "resources"]["limits"]


def kube_cluster(standin, *, size, spares=0, fsx="/checkpoints"):
    """Checkpoints on a shared volume (FSx through a PVC) at `fsx`."""
    cluster = Cluster.objects.create(
        name="eks-a", provider=Cluster.Provider.KUBERNETES,
        settings={"api_url": standin.url, "namespace": NS, "request_timeout_s": 5,
                  "preflight": False, "checkpoint_pvc": "fsx",
                  "checkpoint_mount_path": str(fsx)})
    NodePool.objects.create(cluster=cluster, name="h100", instance_type="p5.48xlarge",
                            gpus_per_node=8, size=size, spare_count=spares, node_selector=POOL,
                            settings={"node_autoscaler": "karpenter"})
    return cluster


def failing(name):
    return {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
            "message": f"{name}: GPU has fallen off the bus",
            "lastTransitionTime": "2026-01-02T00:00:00Z"}


def working(cluster):
    return sorted(Node.objects.filter(cluster=cluster, is_spare=False, state=Node.State.READY)
                  .values_list("name", flat=True))


def test_a_karpenter_pool_keeps_its_size_across_three_replacements(db, standin, tmp_path):
    launched = st.karpenter(standin, POOL)
    cluster = kube_cluster(standin, size=2, fsx=tmp_path)
    for name in ("n1", "n2"):
        standin.put(st.NODES, st.node(name, labels=POOL))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    assert working(cluster) == ["n1", "n2"]

    for round_ in range(3):
        victim = working(cluster)[0]
        standin.get(st.NODES, victim)["status"]["conditions"].append(failing(victim))
        now = later(now, 30)
        reconcile_cluster_unlocked(cluster.id, now)  # cordoned, replaced: a capacity pod asks
        assert Node.objects.get(name=victim).state == Node.State.REPLACED
        assert standin.get(st.NODES, victim) is None
        now = later(now, 30)
        reconcile_cluster_unlocked(cluster.id, now)  # Karpenter's node joins by its labels
        assert len(working(cluster)) == 2, round_
        assert launched[round_] in working(cluster)

    assert launched == ["karp-0", "karp-1", "karp-2"]
    assert Node.objects.filter(cluster=cluster, state=Node.State.REPLACED).count() == 3

    # A job placed on the successors frees their GPUs from the capacity pods first.
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, storage_uri=str(tmp_path / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    placed = set(job.attempts.get().placements.values_list("node__name", flat=True))
    on_placed = [p for p in standin.store.get(PODS, {}).values()
                 if p["spec"].get("nodeName") in placed
                 and p["metadata"]["labels"].get("regatta.io/purpose") == "capacity"]
    assert on_placed == []
    body = standin.calls("POST", st.pytorchjobs(NS))[0].body
    master = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    avoided = master["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert placed == {"n2", "karp-2"}
    # The three replaced nodes, kept off in case their Nodes linger.
    assert set(avoided["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]) == {
        "n1", "karp-0", "karp-1"}


def test_a_karpenter_spare_is_a_capacity_pod_until_its_node_joins(db, standin):
    cluster = kube_cluster(standin, size=1, spares=1)
    standin.put(st.NODES, st.node("n1", labels=POOL))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    (spare,) = Node.objects.filter(cluster=cluster, is_spare=True)
    assert spare.state == Node.State.PROVISIONING
    (pod,) = standin.store[PODS].values()
    assert pod["metadata"]["labels"][capacity.LABEL_FOR] == spare.name

    reconcile_cluster_unlocked(cluster.id, later(now, 30))  # still pending: the row waits
    assert Node.objects.filter(cluster=cluster, is_spare=True).get().state == (
        Node.State.PROVISIONING)
    assert len(standin.store[PODS]) == 1

    # Karpenter's node comes up and takes the pod: it joins as the spare.
    standin.put(st.NODES, st.node("karp-x", labels=POOL))
    pod["spec"]["nodeName"] = "karp-x"
    reconcile_cluster_unlocked(cluster.id, later(now, 60))
    spares = Node.objects.filter(cluster=cluster, is_spare=True,
                                 state__in=(Node.State.READY, Node.State.PROVISIONING))
    assert [n.name for n in spares] == ["karp-x"]
    assert working(cluster) == ["n1"]
    assert len(standin.store[PODS]) == 1  # no second ask


def test_a_capacity_pod_round_trips_through_the_official_models():
    pod = capacity.capacity_pod(karpenter_pool(efa=True), KubeSettings(priority_class="low"),
                                "replaces/n1", spare_name="eks-a-h100-3", avoid=("n1",))
    data = mf.to_dict(pod)
    assert mf.to_dict(mf.from_dict(data, "V1Pod")) == data
    assert data["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert data["metadata"]["labels"][capacity.LABEL_FOR] == "eks-a-h100-3"
    assert data["spec"]["priorityClassName"] == "low"
    # Sized like a training pod of the pool, so Karpenter picks the same type.
    limits = data["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "8", "cpu": "172800m", "memory": "1887436Mi"}


def test_a_preflight_in_a_karpenter_pool_runs_on_exactly_its_nodes():
    from clusters.providers.base import Placement

    job = mf.to_dict(mf.preflight_job(karpenter_pool(), (Placement("n1", 0),
                                                          Placement("n2", 1)),
                                      KubeSettings(), "nonce"))
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In",
                                         "values": ["n2"]}]
