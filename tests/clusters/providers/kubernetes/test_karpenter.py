"""A Karpenter pool: placement by the pool's labels, and capacity asked of
Karpenter the way it understands (a pending pod), so the pool keeps its size.

On the real test cluster (tests/support/kube_cluster.py): the scheduler
binds the capacity pods, the reconcilers act with deploy/'s token. Karpenter
itself is not here (its module is not among the test cluster's), so the
test plays its controller, and only that: a new kwok node with the pool's
labels for each capacity pod the scheduler left pending (PlayKarpenter).
"""

import itertools

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings, capacity
from clusters.providers.kubernetes import manifests as mf
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
from testcluster import bootstrap
from testcluster.fleet import Pool
from tests.fleet_helpers import later, launch, submit, team_with_quota
from tests.support.kube_cluster import CHECKPOINT_PVC, TRAINING_NS
from tests.support.waiting import eventually

from .test_manifests import make_pool, make_request

NS = TRAINING_NS
POOL = {"karpenter.sh/nodepool": "h100"}


pytestmark = pytest.mark.timeout(240)
real_cluster = pytest.mark.slow
_claims = itertools.count()


def karpenter_labels(pool):
    return {"karpenter.sh/nodepool": pool.name}


def karpenter_kwok_pool(world, size):
    """kwok nodes labelled as Karpenter labels a NodePool's, and the
    PoolInfo Regatta has of them."""
    pool = world.make_pool(size=size)
    for i in range(pool.size):  # a NodePool named as the test's pool
        world.core.patch_node(pool.node_name(i), {"metadata": {"labels": karpenter_labels(pool)}})
    return pool, karpenter_pool(name=pool.name, node_selector=karpenter_labels(pool))


class PlayKarpenter:
    """Karpenter's controller for one NodePool: a node for each capacity pod
    of the pool that the scheduler could not place. The node registers with
    the NodePool's labels (kwok makes it ready); the scheduler binds the pod."""

    def __init__(self, world, pool):
        self.world, self.pool = world, pool
        self.launched: list[str] = []

    def launch_for_pending(self) -> list[str]:
        pending = eventually(lambda: [p for p in capacity_pods(self.world)
                                      if unschedulable(self.world, p["metadata"]["name"])],
                             timeout=30, interval=0.2, what="a pending capacity pod")
        made = []
        for pod in pending:
            claim = Pool(name=f"claim{next(_claims):03d}", size=1, labels=karpenter_labels(
                self.pool))
            made.extend(self.world.fleet.add(claim))
            self.world.made_nodes.extend(made[-1:])
            eventually(lambda n=made[-1]: self.world.fleet.ready(n), timeout=30, interval=0.1,
                       what="the new node to be ready")
            eventually(lambda p=pod["metadata"]["name"]: self.world.core.read_namespaced_pod(
                p, NS).spec.node_name, timeout=30, interval=0.2,
                what="the scheduler to bind the capacity pod")
        self.launched.extend(made)
        return made


def capacity_pods(world):
    """The pool's capacity pods as the API server's JSON."""
    return [world.admin.sanitize_for_serialization(p)
            for p in world.pods("regatta.io/purpose=capacity")]


def unschedulable(world, name) -> bool:
    pod = world.core.read_namespaced_pod(name, NS)
    return pod.spec.node_name is None and any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or [])


def node_names(world):
    return {n.metadata.name for n in world.core.list_node().items}


def karpenter_pool(node_selector=None, **kw):
    return make_pool(node_selector=node_selector or POOL,
                     settings={"node_autoscaler": "karpenter"}, **kw)


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


@real_cluster
def test_a_replaced_karpenter_node_asks_for_its_successor_once(kube_world):
    pool, info = karpenter_kwok_pool(kube_world, size=2)
    n1, idle = pool.node_name(0), pool.node_name(1)
    provider = KubernetesProvider(bootstrap.api_client(kube_world.regatta_kubeconfig),
                                  KubeSettings(request_timeout_s=10))
    assert provider.replace(info, n1) is None  # the successor joins later, by label
    provider.replace(info, n1)  # asked again: still one capacity pod
    assert n1 not in node_names(kube_world)
    (pod,) = capacity_pods(kube_world)
    assert pod["metadata"]["labels"]["regatta.io/purpose"] == "capacity"
    spec = pod["spec"]
    assert spec["nodeSelector"] == info.node_selector
    assert spec["terminationGracePeriodSeconds"] == 0
    assert spec["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert spec["containers"][0]["resources"]["requests"] == spec["containers"][0][
        "resources"]["limits"]
    # Karpenter launches only for a pending pod: the pool's idle node may not
    # take it, so the scheduler leaves it pending.
    eventually(lambda: unschedulable(kube_world, pod["metadata"]["name"]), timeout=30,
               interval=0.2, what="the scheduler to leave the capacity pod pending")
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert set(term["matchExpressions"][0]["values"]) == {n1, idle}


def kube_cluster(world, pool, *, size, spares=0, fsx="/checkpoints", node_selector=None):
    """Checkpoints on a shared volume (FSx through the cluster's PVC) at `fsx`;
    the pool's nodes found by Karpenter's label unless `node_selector` says."""
    cluster = Cluster.objects.create(
        name="eks-a", provider=Cluster.Provider.KUBERNETES,
        settings={"kubeconfig": str(world.regatta_kubeconfig), "namespace": NS,
                  "request_timeout_s": 10, "preflight": False,
                  "checkpoint_pvc": CHECKPOINT_PVC, "checkpoint_mount_path": str(fsx)})
    NodePool.objects.create(cluster=cluster, name=pool.name, instance_type="p5.48xlarge",
                            gpus_per_node=8, size=size, spare_count=spares,
                            node_selector=node_selector or karpenter_labels(pool),
                            settings={"node_autoscaler": "karpenter"})
    return cluster


def failing(world, name):
    """EKS's node monitoring agent reports a fatal XID on the node."""
    world.core.patch_node_status(name, {"status": {"conditions": [{
        "type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
        "message": f"{name}: GPU has fallen off the bus",
        "lastHeartbeatTime": "2026-01-02T00:00:00Z",
        "lastTransitionTime": "2026-01-02T00:00:00Z"}]}})


def working(cluster):
    return sorted(Node.objects.filter(cluster=cluster, is_spare=False, state=Node.State.READY)
                  .values_list("name", flat=True))


@real_cluster
def test_a_karpenter_pool_keeps_its_size_across_three_replacements(db, kube_world, tmp_path):
    pool, _ = karpenter_kwok_pool(kube_world, size=2)
    karpenter = PlayKarpenter(kube_world, pool)
    cluster = kube_cluster(kube_world, pool, size=2, fsx=tmp_path)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    n1, n2 = pool.node_name(0), pool.node_name(1)
    assert working(cluster) == [n1, n2]

    for round_ in range(3):
        victim = working(cluster)[0] if round_ == 0 else karpenter.launched[-1]
        failing(kube_world, victim)
        now = later(now, 30)

        def replaced(at=now, victim=victim):
            # The condition reaches the pass through the node informer's watch.
            reconcile_cluster_unlocked(cluster.id, at)  # cordoned, replaced: a capacity pod asks
            return Node.objects.get(name=victim).state == Node.State.REPLACED

        eventually(replaced, timeout=30, interval=0.2, what=f"the pass to replace {victim}")
        assert victim not in node_names(kube_world)
        karpenter.launch_for_pending()  # a node for the pending pod, which the scheduler binds
        now = later(now, 30)

        def joined(at=now):
            reconcile_cluster_unlocked(cluster.id, at)  # Karpenter's node joins by its labels
            return len(working(cluster)) == 2

        eventually(joined, timeout=30, interval=0.2, what=f"round {round_}'s node to join")
        assert karpenter.launched[round_] in working(cluster)

    assert len(karpenter.launched) == 3
    assert Node.objects.filter(cluster=cluster, state=Node.State.REPLACED).count() == 3

    # A job placed on the successors frees their GPUs from the capacity pods first.
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, storage_uri=str(tmp_path / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    placed = set(job.attempts.get().placements.values_list("node__name", flat=True))
    eventually(lambda: not [p for p in capacity_pods(kube_world)
                            if p["spec"].get("nodeName") in placed], timeout=30, interval=0.2,
               what="the capacity pods on the placed nodes to go")
    body = kube_world.pytorchjob(job.attempts.get().provider_ref["name"])
    master = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    avoided = master["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert placed == {n2, karpenter.launched[2]}
    # The three replaced nodes, kept off in case their Nodes linger.
    assert set(avoided["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]) == {
        n1, karpenter.launched[0], karpenter.launched[1]}


@real_cluster
def test_a_karpenter_spare_is_a_capacity_pod_until_its_node_joins(db, kube_world):
    pool, _ = karpenter_kwok_pool(kube_world, size=1)
    karpenter = PlayKarpenter(kube_world, pool)
    cluster = kube_cluster(kube_world, pool, size=1, spares=1)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    (spare,) = Node.objects.filter(cluster=cluster, is_spare=True)
    assert spare.state == Node.State.PROVISIONING
    (pod,) = capacity_pods(kube_world)
    assert pod["metadata"]["labels"][capacity.LABEL_FOR] == spare.name
    # Pending: the pool's one node, idle, may not take it.
    eventually(lambda: unschedulable(kube_world, pod["metadata"]["name"]), timeout=30,
               interval=0.2, what="the scheduler to leave the capacity pod pending")

    reconcile_cluster_unlocked(cluster.id, later(now, 30))  # still pending: the row waits
    assert Node.objects.filter(cluster=cluster, is_spare=True).get().state == (
        Node.State.PROVISIONING)
    assert len(capacity_pods(kube_world)) == 1

    # Karpenter's node comes up and takes the pod: it joins as the spare.
    (joined,) = karpenter.launch_for_pending()
    reconcile_cluster_unlocked(cluster.id, later(now, 60))
    spares = Node.objects.filter(cluster=cluster, is_spare=True,
                                 state__in=(Node.State.READY, Node.State.PROVISIONING))
    assert [n.name for n in spares] == [joined]
    assert working(cluster) == [pool.node_name(0)]
    assert len(capacity_pods(kube_world)) == 1  # no second ask


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
