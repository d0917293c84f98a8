"""The real reconcilers driving the Kubernetes provider.

No Kubernetes API server can run here: tests/support/k8s_standin.py serves
the shapes a real one returns over real HTTP on 127.0.0.1, through the
official client. The cluster and job reconcilers run as in production
(clusters.reconcile.reconcile_cluster_unlocked, jobs.reconcile.reconcile_job_unlocked) against
a real database; the stand-in plays the API server, and the test plays the
training operator by putting the pods it would make.
"""

import json

import pytest
from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster, Node, NodeEvent, NodeHealthEvent, NodePool
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase, hash_token
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import later, launch, submit, team_with_quota, write_checkpoint
from tests.support import k8s_standin as st

NS = "regatta-training"
JOBS = st.pytorchjobs(NS)
SECRETS = st.namespaced(NS, "secrets")
PODS = st.namespaced(NS, "pods")
GROUP = {"eks.amazonaws.com/nodegroup": "h100"}
DCGM_LABEL = "example.com/dcgm-diag"


@pytest.fixture
def standin():
    with st.K8sStandIn() as server:
        yield server


def kube_cluster(standin, *, size, **settings_):
    cluster = Cluster.objects.create(
        name="eks-a", provider=Cluster.Provider.KUBERNETES,
        settings={"api_url": standin.url, "namespace": NS, "request_timeout_s": 5,
                  "preflight": "dcgm-labels", "health_labels": {DCGM_LABEL: "pass"},
                  **settings_},
    )
    NodePool.objects.create(cluster=cluster, name="h100", instance_type="p5.48xlarge",
                            gpus_per_node=8, size=size, spare_count=0, node_selector=GROUP,
                            settings={"node_autoscaler": "karpenter"})
    return cluster


def hardware(status, reason, when="2026-01-02T00:00:00Z", message=""):
    return {"type": "AcceleratedHardwareReady", "status": status, "reason": reason,
            "message": message, "lastTransitionTime": when}


def test_it_turns_the_clusters_nodes_and_their_health_into_rows(db, standin):
    cluster = kube_cluster(standin, size=6)
    standin.put(st.NODES, st.node("n-ok", labels={**GROUP, DCGM_LABEL: "pass"},
                                  instance="i-0aaa", conditions=[hardware("True", "Ok")]))
    standin.put(st.NODES, st.node("n-xid", labels=GROUP, conditions=[
        hardware("False", "NvidiaXID79Error", message="GPU has fallen off the bus")]))
    standin.put(st.NODES, st.node("n-plugin", labels=GROUP, gpus=8, allocatable=6))
    standin.put(st.NODES, st.node("n-dcgm", labels={**GROUP, DCGM_LABEL: "ecc-dbe"}))
    standin.put(st.NODES, st.node("n-down", labels=GROUP, ready=False))
    standin.put(st.NODES, st.node("cpu-1", labels={"eks.amazonaws.com/nodegroup": "cpu"}))
    now = timezone.now()

    reconcile_cluster_unlocked(cluster.id, now)

    rows = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    assert set(rows) == {"n-ok", "n-xid", "n-plugin", "n-dcgm", "n-down"}
    ok = rows["n-ok"]
    assert (ok.state, ok.gpus, ok.provider_id) == ("ready", 8, "aws:///us-east-1a/i-0aaa")
    assert ok.labels[DCGM_LABEL] == "pass" and ok.address.startswith("10.0.0.")
    assert rows["n-plugin"].gpus == 6  # allocatable, not capacity
    assert not ok.health_events.exists()

    events = {e.node.name: e for e in NodeHealthEvent.objects.filter(node__cluster=cluster)}
    assert {(name, e.kind, e.severity) for name, e in events.items()} == {
        ("n-xid", "xid", "critical"), ("n-plugin", "xid", "critical"),
        ("n-dcgm", "ecc", "critical"), ("n-down", "lost", "critical")}
    assert "GPU has fallen off the bus" in events["n-xid"].message
    assert events["n-xid"].evidence["condition"]["reason"] == "NvidiaXID79Error"
    assert events["n-plugin"].evidence["capacity"] == 8
    assert events["n-dcgm"].evidence["value"] == "ecc-dbe"
    assert all(e.handled_at == now for e in events.values())

    # Nothing runs on them: each is cordoned with its evidence and replaced (a
    # Karpenter pool: the Node is deleted and Karpenter brings a new one).
    for name in ("n-xid", "n-plugin", "n-dcgm", "n-down"):
        rows[name].refresh_from_db()
        assert rows[name].state == Node.State.REPLACED, name
        assert NodeEvent.objects.filter(node=rows[name], to_state="cordoned").count() == 1
        patches = standin.calls("PATCH", f"{st.NODES}/{name}")
        assert any(p.body == {"spec": {"unschedulable": True}} for p in patches), name
        assert standin.get(st.NODES, name) is None  # deleted for Karpenter to replace
    assert standin.get(st.NODES, "n-ok")["spec"].get("unschedulable") is None

    reconcile_cluster_unlocked(cluster.id, later(now, 30))  # the same conditions, seen again
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 4


def test_a_nodes_new_dcgm_failure_on_a_later_sweep_is_a_new_event(db, standin):
    cluster = kube_cluster(standin, size=1)
    standin.put(st.NODES, st.node("n1", labels=GROUP, conditions=[hardware("True", "Ok")]))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    assert Node.objects.get(name="n1").state == Node.State.READY

    standin.get(st.NODES, "n1")["status"]["conditions"][1] = hardware(
        "False", "DCGMDiagFailure", when="2026-01-03T00:00:00Z", message="diag level 2")
    reconcile_cluster_unlocked(cluster.id, later(now, 10))
    (event,) = NodeHealthEvent.objects.filter(node__name="n1")
    assert (event.kind, event.severity) == ("dcgm", "critical")
    assert event.evidence["key"] == "n1/AcceleratedHardwareReady/2026-01-03T00:00:00Z"
    n1 = Node.objects.get(name="n1")
    assert n1.state == Node.State.REPLACED  # idle: cordoned with the evidence and replaced
    assert n1.events.filter(to_state="cordoned").exists()


def launched_job(standin, fsx, nodes=("n1", "n2", "n3")):
    """Checkpoints on a shared file system (FSx for Lustre through a PVC),
    mounted at the same path in the ranks and here."""
    cluster = kube_cluster(standin, size=len(nodes), checkpoint_pvc="fsx-lustre",
                           checkpoint_mount_path=str(fsx))
    for name in nodes:
        standin.put(st.NODES, st.node(name, labels=GROUP, instance=f"i-0{name}"))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"),
                 hyperparameters={"model": "nano", "max_steps": 50})
    launch(job, later(now, 1))
    job.refresh_from_db()
    return job, later(now, 1)


@pytest.fixture
def fsx(tmp_path):
    path = tmp_path / "fsx"
    path.mkdir()
    return path


def test_a_jobs_launch_creates_its_pytorchjob_and_token_secret(db, standin, fsx):
    job, now = launched_job(standin, fsx)

    assert job.phase == Phase.STARTING
    attempt = job.attempts.get()
    assert attempt.state == JobAttempt.State.STARTING
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    assert len(placed) == 2
    name = f"job-{job.id}-a1"
    job_posts = standin.calls("POST", JOBS)
    assert len(job_posts) == 1
    body = job_posts[0].body
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
        assert spec["nodeSelector"] == GROUP
        assert spec["volumes"] == [{"name": "checkpoints",
                                    "persistentVolumeClaim": {"claimName": "fsx-lustre"}}]
        (container,) = spec["containers"]
        assert container["image"] == "registry.example/trainer:2.1"
        # Guaranteed QoS, sized from the nodes' allocatable (191 CPUs, 2000Gi)
        # less a tenth for their DaemonSets.
        assert container["resources"]["limits"] == {
            "nvidia.com/gpu": "8", "cpu": "171900m", "memory": "1843200Mi"}
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
    (secret_post,) = standin.calls("POST", SECRETS)
    assert hash_token(secret_post.body["stringData"]["token"]) == attempt.token_hash
    assert standin.get(SECRETS, f"{name}-token")["metadata"]["ownerReferences"][0]["uid"] == (
        standin.get(JOBS, name)["metadata"]["uid"])

    assert attempt.provider_ref["name"] == name
    assert attempt.provider_ref["uid"] == standin.get(JOBS, name)["metadata"]["uid"]
    assert attempt.preflight["method"] == "dcgm-labels" and attempt.preflight["ok"] is True
    launched = job.events.get(kind="Launched")
    assert launched.evidence["nodes"] == placed
    assert job.events.filter(kind="PreflightPassed").count() == 1


def test_a_job_whose_pytorchjob_succeeds_succeeds(db, standin, fsx, fleet_dirs):
    job, now = launched_job(standin, fsx)
    attempt = job.attempts.get()
    # What rank 0 leaves on the shared volume at the last step, and reports.
    write_checkpoint(job, 50, attempt)
    name = attempt.provider_ref["name"]
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    standin.get(JOBS, name)["status"] = {"conditions": [
        st.job_condition("Running"), st.job_condition("Succeeded")]}
    standin.put(PODS, st.pod(name, "Master", 0, node_name=placed[0], phase="Succeeded",
                             exit_code=0, reason="Completed"))
    standin.put(PODS, st.pod(name, "Worker", 0, node_name=placed[1], phase="Succeeded",
                             exit_code=0, reason="Completed"))

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert attempt.state == JobAttempt.State.SUCCEEDED and attempt.exit_code == 0
    assert job.events.filter(kind="NodesReleased").count() == 1
    assert job.events.get(kind="ModelExported").evidence["step"] == 50
    assert len(standin.calls("POST", JOBS)) == 1  # nothing relaunched


def test_a_rank_that_dies_with_its_node_is_relaunched_elsewhere(db, standin, fsx):
    job, now = launched_job(standin, fsx)
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    standin.get(JOBS, name)["status"] = {"conditions": [st.job_condition("Running")]}
    standin.put(PODS, st.pod(name, "Master", 0, node_name=placed[0]))
    # Evicted with its node: no container exit, which the protocol calls hardware.
    lost = st.pod(name, "Worker", 0, node_name=placed[1], phase="Failed",
                  status_reason="NodeLost", message="node went away")
    lost["status"]["containerStatuses"] = []
    standin.put(PODS, lost)

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state in JobAttempt.ENDED
    # The first attempt's PyTorchJob is deleted and a second one launched
    # without the lost node.
    assert any(c.path == f"{JOBS}/{name}" for c in standin.calls("DELETE"))
    second = job.attempts.get(number=2)
    new_nodes = set(second.placements.values_list("node__name", flat=True))
    assert placed[1] not in new_nodes and len(new_nodes) == 2
    assert standin.get(JOBS, f"job-{job.id}-a2") is not None
    assert attempt.failure_class == "hardware" and job.phase == Phase.STARTING
    assert {"NodeFailed", "NodeCordoned"} <= set(job.events.values_list("kind", flat=True))
    # The lost node is cordoned, then replaced the Karpenter pool's way, by
    # the cluster's reconcile (the job's pass only claimed the replacement).
    reconcile_cluster_unlocked(job.cluster_id, later(now, 6))
    bad = Node.objects.get(name=placed[1])
    assert bad.state == Node.State.REPLACED
    assert [(c.method, c.body) for c in standin.requests
            if c.path == f"{st.NODES}/{placed[1]}" and c.method != "GET"] == [
        ("PATCH", {"spec": {"unschedulable": True}}), ("DELETE", None)]
    assert standin.get(st.NODES, placed[1]) is None
