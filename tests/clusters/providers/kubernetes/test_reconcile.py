"""The real reconcilers driving the Kubernetes provider on the real test
cluster.

The cluster and job reconcilers run as in production
(clusters.reconcile.reconcile_cluster_unlocked,
jobs.reconcile.reconcile_job_unlocked) against a real database and the
API server of tests/support/kube_cluster.py, with deploy/'s rights; the
training operator makes the pods, kwok runs them. What no component here
does, the test does as the component would: the EKS node monitoring
agent's and the device plugin's status writes, a container's exit, a pod
lost with its node. tests/support/kube_calls.py records what the
reconcilers' providers sent.
"""

import base64
import json

import pytest
from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster, Node, NodeEvent, NodeHealthEvent, NodePool
from clusters.providers.kubernetes.observe import CORDONED_BY_REGATTA
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase, hash_token
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import later, launch, submit, team_with_quota, write_checkpoint
from tests.support.kube_calls import record_every_provider
from tests.support.kube_cluster import CHECKPOINT_PVC, TRAINING_NS, seen_by_informers
from tests.support.waiting import eventually

from .test_provider import (
    as_device_plugin,
    as_kubelet,
    as_monitoring_agent,
    not_ready,
    pods_by_node,
    ranks,
)
from .test_real_cluster import OPERATOR_JOB_LABEL, condition_true

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NS = TRAINING_NS
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
NODES = "/api/v1/nodes"
DCGM_LABEL = "example.com/dcgm-diag"
# Regatta's cordon, marked as its own (an admin's has no mark).
REGATTAS_CORDON = {"metadata": {"annotations": {CORDONED_BY_REGATTA: "true"}},
                   "spec": {"unschedulable": True}}


@pytest.fixture
def calls(monkeypatch):
    return record_every_provider(monkeypatch)


def kube_cluster(world, pool, **settings_):
    cluster = Cluster.objects.create(
        name="eks-a", provider=Cluster.Provider.KUBERNETES,
        settings={"kubeconfig": str(world.regatta_kubeconfig), "namespace": NS,
                  "request_timeout_s": 10, "preflight": "dcgm-labels",
                  "health_labels": {DCGM_LABEL: "pass"}, **settings_},
    )
    NodePool.objects.create(cluster=cluster, name=pool.name, instance_type=pool.instance_type,
                            gpus_per_node=8, size=pool.size, spare_count=0,
                            node_selector=pool.selector,
                            settings={"node_autoscaler": "karpenter"})
    return cluster


def node_names(world):
    return {n.metadata.name for n in world.core.list_node().items}


def test_it_turns_the_clusters_nodes_and_their_health_into_rows(db, kube_world, calls):
    pool = kube_world.make_pool(size=5, labels={DCGM_LABEL: "pass"})
    kube_world.make_pool(size=1)  # another pool's node
    cluster = kube_cluster(kube_world, pool)
    n_ok, n_xid, n_plugin, n_dcgm, n_down = (pool.node_name(i) for i in range(5))
    as_monitoring_agent(kube_world, n_ok, "True", "Ok")
    as_monitoring_agent(kube_world, n_xid, "False", "NvidiaXID79Error",
                        "GPU has fallen off the bus")
    as_device_plugin(kube_world, n_plugin, 6)
    seen_by_informers(kube_world, "nodes", kube_world.core.patch_node(
        n_dcgm, {"metadata": {"labels": {DCGM_LABEL: "ecc-dbe"}}}))
    now = timezone.now()

    reconcile_cluster_unlocked(cluster.id, now)
    # A node in service goes NotReady. That is a state, not evidence yet: it
    # fails only once it lasted the cluster's grace (a controller's brief
    # NodeStatusUnknown is no failure).
    not_ready(kube_world, n_down)
    went = later(now, 1)

    def noted():
        reconcile_cluster_unlocked(cluster.id, went)
        row = Node.objects.get(cluster=cluster, name=n_down)
        return row if row.not_ready_since == went else None

    down = eventually(noted, timeout=10, interval=0.2, what="the pass to see it not ready")
    assert down.state == Node.State.READY and not down.health_events.exists()
    grace = cluster.config.node_failure_grace_s
    failed_at = later(went, grace + 1)
    reconcile_cluster_unlocked(cluster.id, failed_at)

    rows = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    assert set(rows) == {n_ok, n_xid, n_plugin, n_dcgm, n_down}
    ok = rows[n_ok]
    real = kube_world.core.read_node(n_ok)
    assert (ok.state, ok.gpus, ok.provider_id) == ("ready", 8, real.spec.provider_id)
    internal = [a.address for a in real.status.addresses if a.type == "InternalIP"]
    assert ok.labels[DCGM_LABEL] == "pass" and ok.address == internal[0]
    assert rows[n_plugin].gpus == 6  # allocatable, not capacity
    assert not ok.health_events.exists()

    events = {e.node.name: e for e in NodeHealthEvent.objects.filter(node__cluster=cluster)}
    assert {(name, e.kind, e.severity) for name, e in events.items()} == {
        (n_xid, "xid", "critical"), (n_plugin, "xid", "critical"),
        (n_dcgm, "ecc", "critical"), (n_down, "lost", "critical")}
    assert "GPU has fallen off the bus" in events[n_xid].message
    assert events[n_xid].evidence["condition"]["reason"] == "NvidiaXID79Error"
    assert events[n_plugin].evidence["capacity"] == 8
    assert events[n_dcgm].evidence["value"] == "ecc-dbe"
    assert events[n_down].evidence["not_ready_for_s"] == grace + 1
    assert events[n_down].evidence["provider_status"]["Ready"] in ("False", "Unknown")
    assert all(e.handled_at == now for name, e in events.items() if name != n_down)
    assert events[n_down].handled_at == failed_at

    # Nothing runs on them: each is cordoned with its evidence and replaced (a
    # Karpenter pool: the Node is deleted and Karpenter brings a new one).
    left = node_names(kube_world)
    for name in (n_xid, n_plugin, n_dcgm, n_down):
        rows[name].refresh_from_db()
        assert rows[name].state == Node.State.REPLACED, name
        assert NodeEvent.objects.filter(node=rows[name], to_state="cordoned").count() == 1
        patches = calls.calls("PATCH", f"{NODES}/{name}")
        assert any(p.body == REGATTAS_CORDON for p in patches), name
        assert name not in left  # deleted for Karpenter to replace
    assert kube_world.core.read_node(n_ok).spec.unschedulable is None

    reconcile_cluster_unlocked(cluster.id, later(now, grace + 30))  # the same, seen again
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 4


def test_a_nodes_new_dcgm_failure_on_a_later_sweep_is_a_new_event(db, kube_world):
    pool = kube_world.make_pool(size=1, labels={DCGM_LABEL: "pass"})
    cluster = kube_cluster(kube_world, pool)
    n1 = pool.node_name(0)
    as_monitoring_agent(kube_world, n1, "True", "Ok")
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    assert Node.objects.get(name=n1).state == Node.State.READY

    kube_world.core.patch_node_status(n1, {"status": {"conditions": [{
        "type": "AcceleratedHardwareReady", "status": "False", "reason": "DCGMDiagFailure",
        "message": "diag level 2", "lastHeartbeatTime": "2026-01-03T00:00:00Z",
        "lastTransitionTime": "2026-01-03T00:00:00Z"}]}})

    def noted():
        # The condition reaches the pass through the node informer's watch.
        reconcile_cluster_unlocked(cluster.id, later(now, 10))
        return NodeHealthEvent.objects.filter(node__name=n1).exists()

    eventually(noted, timeout=30, interval=0.2, what="the pass to see the condition")
    (event,) = NodeHealthEvent.objects.filter(node__name=n1)
    assert (event.kind, event.severity) == ("dcgm", "critical")
    # Keyed by the spell Regatta saw begin, not by the condition's
    # lastTransitionTime (which some agents leave as it was).
    assert event.evidence["key"] == (f"{n1}/AcceleratedHardwareReady=False"
                                     f"@{later(now, 10).isoformat()}")
    row = Node.objects.get(name=n1)
    assert row.state == Node.State.REPLACED  # idle: cordoned with the evidence and replaced
    assert row.events.filter(to_state="cordoned").exists()


def launched_job(world, fsx):
    pool = world.make_pool(size=3, labels={DCGM_LABEL: "pass"})
    cluster = kube_cluster(world, pool, checkpoint_pvc=CHECKPOINT_PVC,
                           checkpoint_mount_path=str(fsx))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"),
                 hyperparameters={"model": "nano", "max_steps": 50})
    launch(job, later(now, 1))
    job.refresh_from_db()
    return job, pool, later(now, 1)


def test_a_jobs_launch_creates_its_pytorchjob_and_token_secret(db, kube_world, calls, fsx):
    job, pool, now = launched_job(kube_world, fsx)

    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    assert attempt.state == JobAttempt.State.STARTING
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    assert len(placed) == 2
    name = f"job-{job.id}-a1"
    assert len(calls.calls("POST", JOBS)) == 1
    body = kube_world.pytorchjob(name)  # as the API server keeps it
    assert body["metadata"]["name"] == name and body["metadata"]["namespace"] == NS
    assert body["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "regatta", "regatta.io/job-id": str(job.id),
        "regatta.io/attempt-id": str(attempt.id), "regatta.io/purpose": "attempt"}
    assert body["spec"]["nprocPerNode"] == "8"
    replicas = body["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
    for kind, node in (("Master", placed[0]), ("Worker", placed[1])):
        spec = replicas[kind]["template"]["spec"]
        # A Karpenter pool: the chosen node preferred, the pool by its labels.
        (preferred,) = spec["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred["preference"]["matchExpressions"][0]["values"] == [node]
        assert spec["nodeSelector"] == pool.selector
        assert spec["volumes"] == [{"name": "checkpoints",
                                    "persistentVolumeClaim": {"claimName": CHECKPOINT_PVC}}]
        (container,) = spec["containers"]
        assert container["image"] == "registry.example/trainer:2.1"
        # Guaranteed QoS, sized from the nodes' allocatable (191 CPUs, 2000Gi)
        # less a tenth for their DaemonSets.
        assert container["resources"]["limits"] == {
            "nvidia.com/gpu": "8", "cpu": "171900m", "memory": "1800Gi"}
        assert container["resources"]["requests"] == container["resources"]["limits"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
        assert env["REGATTA_URL"] == settings.PUBLIC_URL
        assert env["REGATTA_JOB_ID"] == str(job.id)
        assert env["REGATTA_ATTEMPT_ID"] == str(attempt.id)
        assert env["REGATTA_CHECKPOINT_URI"] == str(fsx / "train")
        assert env["REGATTA_RESUME_STEP"] == "none"
        assert json.loads(env["REGATTA_CONFIG"])["max_steps"] == 50
        assert env["REGATTA_TOKEN"] == {"secretKeyRef": {"name": f"{name}-token",
                                                         "key": "token"}}
    # The token the ranks read is the one whose hash the attempt keeps.
    assert len(calls.calls("POST", SECRETS)) == 1
    secret = kube_world.core.read_namespaced_secret(f"{name}-token", NS)
    assert hash_token(base64.b64decode(secret.data["token"]).decode()) == attempt.token_hash
    assert secret.metadata.owner_references[0].uid == body["metadata"]["uid"]

    assert attempt.provider_ref["name"] == name
    assert attempt.provider_ref["uid"] == body["metadata"]["uid"]
    assert attempt.preflight["method"] == "dcgm-labels" and attempt.preflight["ok"] is True
    launched = job.events.get(kind="Launched")
    assert launched.evidence["nodes"] == placed
    assert job.events.filter(kind="PreflightPassed").count() == 1


def running_pods(world, attempt):
    """The attempt's pods by rank, once the scheduler has placed each on the
    node Regatta preferred and kwok runs them."""
    placed = dict(attempt.placements.values_list("node_rank", "node__name"))
    name = attempt.provider_ref["name"]
    pods = eventually(lambda: pods_by_node(world, name, len(placed)), timeout=60,
                      interval=0.2, what="the operator's pods to run")
    assert set(pods) == set(placed.values())
    return ranks(pods)


def test_a_job_whose_pytorchjob_succeeds_succeeds(db, kube_world, calls, fsx, fleet_dirs):
    job, pool, now = launched_job(kube_world, fsx)
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    pods = running_pods(kube_world, attempt)
    # What rank 0 leaves on the shared volume at the last step, and reports.
    write_checkpoint(job, 50, attempt)
    for pod in pods.values():  # every rank exits 0
        kube_world.fleet.succeed_pod(NS, pod.metadata.name)
    eventually(lambda: condition_true(kube_world.pytorchjob(name), "Succeeded"), timeout=30,
               interval=0.2, what="the operator to mark the PyTorchJob Succeeded")

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert attempt.state == JobAttempt.State.SUCCEEDED and attempt.exit_code == 0
    assert job.events.filter(kind="NodesReleased").count() == 1
    assert job.events.get(kind="ModelExported").evidence["step"] == 50
    assert len(calls.calls("POST", JOBS)) == 1  # nothing relaunched


def test_a_rank_that_dies_with_its_node_is_relaunched_elsewhere(db, kube_world, calls, fsx):
    job, pool, now = launched_job(kube_world, fsx)
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    pods = running_pods(kube_world, attempt)
    eventually(lambda: condition_true(kube_world.pytorchjob(name), "Running"), timeout=30,
               interval=0.2, what="the PyTorchJob's Running condition")
    lost_pod = pods[1]
    lost_node = lost_pod.spec.node_name
    # Lost with its node: failed with no container exit, which the protocol
    # calls hardware.
    as_kubelet(kube_world, lost_pod.metadata.name, [
        {"op": "replace", "path": "/status/phase", "value": "Failed"},
        {"op": "add", "path": "/status/reason", "value": "NodeLost"},
        {"op": "add", "path": "/status/message", "value": "node went away"},
        {"op": "remove", "path": "/status/containerStatuses"}])

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state in JobAttempt.ENDED
    # The first attempt's PyTorchJob is deleted and a second one launched
    # without the lost node.
    assert any(c.path == f"{JOBS}/{name}" for c in calls.calls("DELETE"))
    second = job.attempts.get(number=2)
    new_nodes = set(second.placements.values_list("node__name", flat=True))
    assert lost_node not in new_nodes and len(new_nodes) == 2
    assert kube_world.pytorchjob(f"job-{job.id}-a2") is not None
    assert attempt.failure_class == "hardware" and job.phase == Phase.STARTING
    assert {"NodeFailed", "NodeCordoned"} <= set(job.events.values_list("kind", flat=True))
    # The lost node is cordoned, then replaced the Karpenter pool's way, by
    # the cluster's reconcile (the job's pass only claimed the replacement).
    reconcile_cluster_unlocked(job.cluster_id, later(now, 6))
    bad = Node.objects.get(name=lost_node)
    assert bad.state == Node.State.REPLACED
    assert [(c.method, c.body) for c in calls.made
            if c.path == f"{NODES}/{lost_node}" and c.method != "GET"] == [
        ("PATCH", REGATTAS_CORDON), ("DELETE", None)]
    assert lost_node not in node_names(kube_world)
    # The relaunch runs on the healthy nodes.
    second_pods = eventually(lambda: pods_by_node(kube_world, f"job-{job.id}-a2", 2),
                             timeout=60, interval=0.2, what="the relaunch's pods to run")
    assert set(second_pods) == new_nodes
    assert not [p for p in kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}")
                if p.spec.node_name == lost_node and p.status.phase == "Running"]
