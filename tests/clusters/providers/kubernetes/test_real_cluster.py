"""The Kubernetes provider and the reconcilers against a real control plane.

tests/support/kube_cluster.py starts etcd, kube-apiserver (Node,RBAC),
kube-scheduler, kube-controller-manager, kwok and the Kubeflow
training-operator from testcluster/, applies deploy/, and hands Regatta a
kubeconfig holding deploy/'s ServiceAccount token. Everything here happens
as it would on a cluster: the operator makes the pods, the scheduler binds
them, the controller-manager garbage-collects and taints. kwok plays the
kubelets and runs no containers, so what the trainer would report (its
heartbeats, a crash) a test reports itself, and a test chooses when a
container exits, with what code (testcluster/fleet.py).
"""

from __future__ import annotations

import base64

import pytest
from django.utils import timezone
from kubernetes import client as k8s

from clusters.models import Cluster, Node, NodePool
from clusters.providers.registry import get_provider, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from controlplane.lib.errors import TemporaryError
from jobs.models import JobAttempt, Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.api_factories import worker_client
from tests.fleet_helpers import heartbeat, later, launch, submit, team_with_quota
from tests.support.kube_cluster import CHECKPOINT_PVC, TRAINING_NS
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DCGM_LABEL = "example.com/dcgm-diag"
OPERATOR_JOB_LABEL = "training.kubeflow.org/job-name"


def kube_cluster(world, pool, fsx, **settings_):
    cluster = Cluster.objects.create(
        name="kwok-a", provider=Cluster.Provider.KUBERNETES,
        settings={"kubeconfig": str(world.regatta_kubeconfig), "namespace": TRAINING_NS,
                  "request_timeout_s": 10, "preflight": "dcgm-labels",
                  "health_labels": {DCGM_LABEL: "pass"}, "checkpoint_pvc": CHECKPOINT_PVC,
                  "checkpoint_mount_path": str(fsx), **settings_},
    )
    NodePool.objects.create(cluster=cluster, name=pool.name, instance_type=pool.instance_type,
                            gpus_per_node=pool.gpus, size=pool.size, spare_count=0,
                            node_selector=pool.selector)
    return cluster


def gpu_pool(world, size=3):
    return world.make_pool(size=size, labels={DCGM_LABEL: "pass"})


def condition_true(job, kind):
    """The PyTorchJob if its condition `kind` is True, else None."""
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    return job if any(c["type"] == kind and c["status"] == "True" for c in conditions) else None


def running_pods(world, name, count):
    pods = world.pods(f"{OPERATOR_JOB_LABEL}={name}")
    if len(pods) == count and all(p.status.phase == "Running" for p in pods):
        return pods
    return None


def test_a_job_runs_on_the_pools_kwok_nodes_through_the_real_operator_and_scheduler(
        db, kube_world, fsx):
    pool = gpu_pool(kube_world)
    cluster = kube_cluster(kube_world, pool, fsx)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    rows = Node.objects.filter(cluster=cluster)
    assert {(n.name, n.state, n.gpus) for n in rows} == {
        (pool.node_name(i), Node.State.READY, 8) for i in range(pool.size)}

    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))

    # The operator makes one pod per replica; the scheduler binds each to the
    # node Regatta chose; kwok brings it to Running.
    pods = eventually(lambda: running_pods(kube_world, name, 2), timeout=60, interval=0.2,
                      what="the operator's pods to run")
    by_type = {p.metadata.labels["training.kubeflow.org/replica-type"]: p for p in pods}
    assert by_type["master"].spec.node_name == placed[0]
    assert by_type["worker"].spec.node_name == placed[1]
    for rank, pod in enumerate((by_type["master"], by_type["worker"])):
        assert pod.metadata.labels["regatta.io/attempt-id"] == str(attempt.id)
        (container,) = pod.spec.containers
        env = {e.name: e for e in container.env}
        # What the operator injects for torchrun's rendezvous: one node per
        # pod, eight processes each.
        assert env["MASTER_ADDR"].value == name + "-master-0"
        assert env["PET_NNODES"].value == "2" and env["PET_NPROC_PER_NODE"].value == "8"
        assert env["PET_NODE_RANK"].value == str(rank)
        assert env["WORLD_SIZE"].value == "16"
        assert env["REGATTA_TOKEN"].value_from.secret_key_ref.name == f"{name}-token"
        assert container.resources.limits["nvidia.com/gpu"] == "8"

    job_obj = eventually(lambda: condition_true(kube_world.pytorchjob(name), "Running"),
                         timeout=30, interval=0.2, what="the PyTorchJob's Running condition")
    assert job_obj["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    assert "backoffLimit" not in job_obj["spec"]["runPolicy"]

    # The trainer's first heartbeat: the one part kwok cannot play.
    heartbeat(attempt, 1, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 6))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.RUNNING
    assert attempt.state == JobAttempt.State.RUNNING


def running_job(world, fsx, *, pool_size=3, nodes=2, image="registry.example/trainer:2.1",
                heartbeats=True, pool_settings=None):
    """A job launched on a fresh pool, its pods Running and (unless told
    otherwise) its trainer's first heartbeat in, so the job is running."""
    pool = gpu_pool(world, size=pool_size)
    cluster = kube_cluster(world, pool, fsx)
    if pool_settings:
        NodePool.objects.filter(cluster=cluster).update(settings=pool_settings)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=8 * pool_size)
    job = submit(cluster, team, nodes=nodes, gpus=8, image=image,
                 storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    if heartbeats:
        eventually(lambda: running_pods(world, name, nodes), timeout=60, interval=0.2,
                   what="the operator's pods to run")
        heartbeat(attempt, 1, later(now, 5))
        reconcile_job_unlocked(job.id, later(now, 6))
        job.refresh_from_db()
        assert job.phase == Phase.RUNNING
    return job, attempt, name, later(now, 6)


def trainer_reports_crash(world, attempt, name, rank, message):
    secret = world.core.read_namespaced_secret(f"{name}-token", TRAINING_NS)
    token = base64.b64decode(secret.data["token"]).decode()
    resp = worker_client(token).post(
        f"/api/v1/worker/attempts/{attempt.pk}/events",
        {"kind": "crashed", "rank": rank, "message": message,
         "data": {"failure_class": "code", "exit_code": 1}}, format="json")
    assert resp.status_code == 201, resp.content


def pod_phase(world, name):
    pods = world.core.list_namespaced_pod(TRAINING_NS, field_selector=f"metadata.name={name}")
    return pods.items[0].status.phase if pods.items else None


def test_a_rank_that_exits_with_an_error_fails_the_job_at_once(db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx)
    # The SDK reports the exception, then the program exits 1 (kwok plays
    # the exit; the report goes through the worker API with the attempt's
    # token, read from the Secret the pods get it from).
    trainer_reports_crash(kube_world, attempt, name, rank=8,
                          message="ValueError: learning rate must be positive")
    kube_world.fleet.fail_pod(TRAINING_NS, f"{name}-worker-0", exit_code=1,
                              message="ValueError: learning rate must be positive")
    eventually(lambda: pod_phase(kube_world, f"{name}-worker-0") == "Failed", timeout=30,
               interval=0.2, what="kwok to fail the worker's container")

    # The operator marks the job Failed and keeps both pods: the exit code
    # stays readable.
    eventually(lambda: condition_true(kube_world.pytorchjob(name), "Failed"), timeout=30,
               interval=0.2, what="the operator to mark the PyTorchJob Failed")
    assert pod_phase(kube_world, f"{name}-master-0") == "Running"
    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.FAILED, (job.phase, job.last_error)
    assert attempt.failure_class == "code" and attempt.exit_code == 1
    assert job.attempts.count() == 1  # never relaunched
    # Its PyTorchJob is deleted, and its pods with it by garbage collection.
    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="the PyTorchJob to go")
    eventually(lambda: not kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}"), timeout=60,
               interval=0.2, what="its pods to go")


def test_an_image_that_cannot_be_pulled_is_the_users_error(db, kube_world, fsx):
    from testcluster.stages import MISSING_IMAGE

    job, attempt, name, now = running_job(kube_world, fsx, image=MISSING_IMAGE, heartbeats=False)

    def pull_failed():
        pods = kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}")
        return len(pods) == 2 and all(
            (p.status.container_statuses or [None])[0] is not None
            and p.status.container_statuses[0].state.waiting is not None
            for p in pods)

    eventually(pull_failed, timeout=60, interval=0.2, what="the image pull to fail")
    reconcile_job_unlocked(job.id, later(now, job.cluster.config.observe_interval_s))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert attempt.failure_class == "code"
    assert "ErrImagePull" in attempt.failure_reason and MISSING_IMAGE in job.last_error


def test_a_gang_the_scheduler_cannot_place_waits_with_the_schedulers_reason(db, kube_world, fsx):
    pool = gpu_pool(kube_world, size=2)
    cluster = kube_cluster(kube_world, pool, fsx)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    # Another tenant's pod holds one node's GPUs: Regatta's rows do not know,
    # the scheduler does.
    other = pool.node_name(0)
    kube_world.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-elses"},
        "spec": {"nodeName": other, "containers": [{
            "name": "c", "image": "registry.example/other:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]

    def unschedulable():
        for pod in kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}"):
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    return cond.message
        return None

    message = eventually(unschedulable, timeout=60, interval=0.2,
                         what="the scheduler to give up on a pod")
    assert "Insufficient nvidia.com/gpu" in message
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    assert "Unschedulable" in job.pending_reason
    assert "Insufficient nvidia.com/gpu" in job.pending_reason

    # The other pod goes: the scheduler places the gang and kwok runs it.
    kube_world.core.delete_namespaced_pod("someone-elses", "default")
    eventually(lambda: running_pods(kube_world, name, 2), timeout=60, interval=0.2,
               what="the gang to be placed")


def test_cancel_deletes_the_pytorchjob_and_garbage_collection_takes_its_pods(db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx)
    assert kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}")

    job.request_cancel("owner", now=later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 2))

    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="the PyTorchJob to go")
    eventually(lambda: not kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}"), timeout=60,
               interval=0.2, what="its pods to go")
    secrets = kube_world.core.list_namespaced_secret(TRAINING_NS).items
    assert f"{name}-token" not in {s.metadata.name for s in secrets}
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED


def test_a_node_that_goes_not_ready_is_cordoned_and_the_job_relaunched_on_healthy_nodes(
        db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx, pool_settings={
        "node_autoscaler": "karpenter"})
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    bad = placed[1]
    kube_world.fleet.make_not_ready(bad)
    eventually(lambda: not kube_world.fleet.ready(bad), timeout=30, interval=0.2,
               what="kwok to report the node NotReady")

    # The first pass that sees it not ready starts its grace; a pass past the
    # grace fails it, with a `lost` health event the job acts on.
    went = later(now, 5)

    def noted():
        reconcile_cluster_unlocked(job.cluster_id, went)
        return Node.objects.get(name=bad).not_ready_since == went

    eventually(noted, timeout=10, interval=0.2, what="the pass to see the node not ready")
    grace = job.cluster.config.node_failure_grace_s
    reconcile_job_unlocked(job.id, later(went, 1))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING and job.attempts.count() == 1  # within the grace
    reconcile_cluster_unlocked(job.cluster_id, later(went, grace + 1))
    assert Node.objects.get(name=bad).state == Node.State.FAILED
    heartbeat(attempt, 2, later(went, grace + 1))
    reconcile_job_unlocked(job.id, later(went, grace + 2))

    # Cordoned by a real PATCH with Regatta's own token.
    node = kube_world.core.read_node(bad)
    assert node.spec.unschedulable is True
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state in JobAttempt.ENDED and attempt.failure_class == "hardware"
    second = job.attempts.get(number=2)
    new_nodes = set(second.placements.values_list("node__name", flat=True))
    assert bad not in new_nodes and len(new_nodes) == 2
    # The relaunch's pods run on the healthy nodes; the first attempt's are gone.
    second_name = second.provider_ref["name"]
    pods = eventually(lambda: running_pods(kube_world, second_name, 2), timeout=60,
                      interval=0.2, what="the relaunch's pods to run")
    assert {p.spec.node_name for p in pods} == new_nodes
    eventually(lambda: not kube_world.pods(f"{OPERATOR_JOB_LABEL}={name}"), timeout=60,
               interval=0.2, what="the first attempt's pods to go")


def test_drain_evicts_through_the_eviction_api_and_honours_a_disruption_budget(db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx)
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    provider = get_provider(job.cluster)
    pool = pool_info(job.cluster.pools.get())
    # Someone protects the gang: all of its pods must stay. (maxUnavailable
    # would not do: the disruption controller cannot count the pods of an
    # owner without a scale subresource, which PyTorchJob lacks.)
    policy = k8s.PolicyV1Api(kube_world.admin)
    policy.create_namespaced_pod_disruption_budget(TRAINING_NS, {
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "whole-gang"},
            "spec": {"minAvailable": 2,
                     "selector": {"matchLabels": {OPERATOR_JOB_LABEL: name}}}})
    worker = f"{name}-worker-0"

    def budget_counted():
        pdb = policy.read_namespaced_pod_disruption_budget("whole-gang", TRAINING_NS)
        return pdb.status and pdb.status.expected_pods == 2

    # The controller-manager's disruption controller must have counted the pods.
    eventually(budget_counted, timeout=30, interval=0.2, what="the budget's status")
    with pytest.raises(TemporaryError):
        provider.drain(pool, placed[1], grace_s=0)
    assert kube_world.core.read_node(placed[1]).spec.unschedulable is True
    assert pod_phase(kube_world, worker) == "Running"

    evicted = kube_world.core.read_namespaced_pod(worker, TRAINING_NS).metadata.uid
    policy.delete_namespaced_pod_disruption_budget("whole-gang", TRAINING_NS)
    provider.drain(pool, placed[1], grace_s=0)

    def evicted_pod_gone():
        pods = kube_world.core.list_namespaced_pod(
            TRAINING_NS, field_selector=f"metadata.name={worker}").items
        return all(p.metadata.uid != evicted for p in pods)

    # The operator makes the missing replica again under the same name (within
    # a minute, as its next pass comes); pinned to the cordoned node, it waits.
    eventually(evicted_pod_gone, timeout=60, interval=0.2, what="the evicted pod to go")
    assert pod_phase(kube_world, f"{name}-master-0") == "Running"


def test_a_restarted_control_plane_finds_the_pytorchjob_and_its_pods_again(db, kube_world, fsx):
    job, attempt, name, now = running_job(kube_world, fsx)
    uid = kube_world.pytorchjob(name)["metadata"]["uid"]

    # A new process knows the attempt only by the reference in its row.
    attempt.refresh_from_db()
    status = get_provider(job.cluster).observe(attempt.provider_ref)
    placed = dict(attempt.placements.values_list("node_rank", "node__name"))
    assert status.state == "running"
    assert {(n.node_rank, n.node, n.running) for n in status.nodes} == {
        (rank, node, True) for rank, node in placed.items()}
    heartbeat(attempt, 40, later(now, 30))
    reconcile_job_unlocked(job.id, later(now, 31))

    job.refresh_from_db()
    assert job.phase == Phase.RUNNING and job.attempts.count() == 1
    assert attempt.provider_ref["uid"] == uid == kube_world.pytorchjob(name)["metadata"]["uid"]


def test_a_spot_interruption_taint_on_an_idle_node_replaces_it_the_karpenter_way(
        db, kube_world, fsx):
    from clusters.models import NodeHealthEvent
    from testcluster.fleet import SPOT_ITN_TAINT

    pool = gpu_pool(kube_world, size=2)
    cluster = kube_cluster(kube_world, pool, fsx)
    NodePool.objects.filter(cluster=cluster).update(settings={"node_autoscaler": "karpenter"})
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    doomed = pool.node_name(0)
    # What AWS Node Termination Handler does on EC2's two-minute notice.
    kube_world.fleet.taint(doomed, SPOT_ITN_TAINT)

    def noticed():
        # The taint reaches the pass through the node informer's watch.
        reconcile_cluster_unlocked(cluster.id, later(now, 5))
        return NodeHealthEvent.objects.filter(node__name=doomed).exists()

    eventually(noticed, timeout=10, interval=0.2, what="the pass to see the taint")
    (event,) = NodeHealthEvent.objects.filter(node__name=doomed)
    assert event.kind == "spot_notice" and event.severity == "critical"
    assert Node.objects.get(name=doomed).state == Node.State.REPLACED
    # Deleted with deploy/'s rights, for Karpenter to terminate, and a
    # capacity pod asks Karpenter for the successor: no node of the pool may
    # take it, not even the idle one, so it stays pending for Karpenter.
    eventually(lambda: doomed not in {n.metadata.name for n in kube_world.core.list_node().items},
               timeout=30, interval=0.2, what="the Node to be deleted")

    def pending_capacity_pod():
        pods = kube_world.pods("regatta.io/purpose=capacity")
        return pods if pods and any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in pods[0].status.conditions or []) else None

    (asked,) = eventually(pending_capacity_pod, timeout=30, interval=0.2,
                          what="the scheduler to leave the capacity pod pending")
    assert asked.spec.node_name is None
    required = asked.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    (term,) = required.node_selector_terms
    assert set(term.match_expressions[0].values) == {doomed, pool.node_name(1)}
