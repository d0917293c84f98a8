"""Attempts as Kubeflow Trainer v2 TrainJobs (`job_api: trainjob`) on the
real test cluster: the Trainer makes a JobSet of the ClusterTrainingRuntime
deploy/trainjob/ ships, the JobSet controller its Jobs, the
controller-manager's Job controller their pods, the scheduler binds them to
the pool's kwok nodes (tests/support/kube_cluster.py). The Trainer's and
JobSet's admission webhooks run too. As in test_kubernetes_real_cluster.py,
a test plays what kwok cannot: the trainer's reports, and when a container
exits.
"""

from __future__ import annotations

import pytest
from django.utils import timezone
from kubernetes import client as k8s

from clusters.models import Node, NodeHealthEvent, NodePool
from clusters.providers.base import Placement
from clusters.providers.kubernetes.preflight import LABEL_CHECKS, checks_label
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase, TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from testcluster import bootstrap
from tests.fleet_helpers import heartbeat, later, launch, submit, team_with_quota
from tests.support.kube_calls import Recorder
from tests.support.kube_cluster import TRAINING_NS
from tests.support.pod_logs import PodLogs
from tests.support.waiting import eventually

from .test_provider import (
    kwok_pool,
    preflight_result,
    provider_for,
    started_preflight,
)
from .test_real_cluster import (
    gpu_pool,
    kube_cluster,
    pod_phase,
    trainer_reports_crash,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def v2_cluster(world, pool, fsx, **settings):
    return kube_cluster(world, pool, fsx, job_api="trainjob", **settings)


def gang(world, name):
    """The attempt's pods by node rank (the Job's completion index)."""
    return {int(p.metadata.labels[INDEX_LABEL]): p for p in world.pods(f"{JOBSET_LABEL}={name}")}


def running_pods(world, name, count):
    pods = gang(world, name)
    if len(pods) == count and all(p.status.phase == "Running" for p in pods.values()):
        return pods
    return None


def condition_true(obj, kind):
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return obj if any(c["type"] == kind and c["status"] == "True" for c in conditions) else None


def owned_by(obj, owner) -> bool:
    return any(ref["uid"] == owner["metadata"]["uid"]
               for ref in obj["metadata"].get("ownerReferences") or [])


def running_job(world, fsx, *, pool_size=3, nodes=2, pool_settings=None, cluster_settings=None,
                **job):
    """A TrainJob launched on a fresh pool, its pods Running and its
    trainer's first heartbeat in, so the job is running."""
    pool = gpu_pool(world, size=pool_size)
    cluster = v2_cluster(world, pool, fsx, **(cluster_settings or {}))
    if pool_settings:
        NodePool.objects.filter(cluster=cluster).update(settings=pool_settings)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=8 * pool_size)
    job = submit(cluster, team, nodes=nodes, gpus=8, image="registry.example/trainer:2.1",
                 storage_uri=str(fsx / "train"), **job)
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    name = attempt.provider_ref["name"]
    pods = eventually(lambda: running_pods(world, name, nodes), timeout=60, interval=0.2,
                      what="the Job controller's pods to run")
    heartbeat(attempt, 1, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 6))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.last_error
    return job, attempt, name, pods, later(now, 6)


def test_a_trainjob_runs_through_the_trainer_jobset_and_job_controllers_and_succeeds(
        db, kube_world, fsx):
    job, attempt, name, pods, now = running_job(kube_world, fsx,
                                                completion=TrainingJob.Completion.EXIT)
    assert attempt.provider_ref["kind"] == "TrainJob"
    placed = set(attempt.placements.values_list("node__name", flat=True))

    # The chain, each link made by its own controller and owned by the last.
    trainjob = kube_world.trainjob(name)
    assert trainjob["spec"]["runtimeRef"]["name"] == "regatta-torch-distributed"
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    jobset = kube_world.jobset(name)
    assert owned_by(jobset, trainjob)
    (batch_job,) = k8s.BatchV1Api(kube_world.admin).list_namespaced_job(
        TRAINING_NS, label_selector=f"{JOBSET_LABEL}={name}").items
    assert batch_job.spec.completions == 2 and batch_job.spec.backoff_limit == 0
    assert batch_job.spec.completion_mode == "Indexed"

    # One pod per chosen node, bound by the scheduler; the Trainer's torch
    # plugin sets torchrun's rendezvous from the node count and the index.
    assert {p.spec.node_name for p in pods.values()} == placed
    for rank, pod in pods.items():
        assert pod.metadata.labels["regatta.io/attempt-id"] == str(attempt.id)
        assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "regatta"
        (container,) = pod.spec.containers
        assert container.name == "node" and container.image == "registry.example/trainer:2.1"
        env = {e.name: e for e in container.env}
        assert env["PET_NNODES"].value == "2" and env["PET_NPROC_PER_NODE"].value == "8"
        assert env["PET_NODE_RANK"].value_from.field_ref.field_path == (
            f"metadata.annotations['{INDEX_LABEL}']")
        assert pod.metadata.annotations[INDEX_LABEL] == str(rank)
        assert env["REGATTA_TOKEN"].value_from.secret_key_ref.name == f"{name}-token"
        assert env["NCCL_DEBUG"].value == "WARN"
        assert container.resources.limits["nvidia.com/gpu"] == "8"
        assert container.command[0] == "torchrun"
        # The checkpoint volume: the job's own folder of the shared claim.
        (mount,) = [m for m in container.volume_mounts if m.name == "checkpoints"]
        assert mount.mount_path == str(fsx / "train") and mount.sub_path == "train"
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.termination_grace_period_seconds == 120

    # Every rank exits 0: the Job completes, the JobSet, then the TrainJob.
    for pod in pods.values():
        kube_world.fleet.succeed_pod(TRAINING_NS, pod.metadata.name)
    eventually(lambda: condition_true(kube_world.trainjob(name), "Complete"), timeout=60,
               interval=0.2, what="the Trainer to mark the TrainJob Complete")
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, (job.phase, job.last_error)
    assert attempt.state == JobAttempt.State.SUCCEEDED and attempt.exit_code == 0


def test_a_rank_that_exits_with_an_error_fails_the_trainjob_at_once(db, kube_world, fsx):
    job, attempt, name, pods, now = running_job(kube_world, fsx)
    failing = pods[1].metadata.name
    trainer_reports_crash(kube_world, attempt, name, rank=8,
                          message="ValueError: learning rate must be positive")
    kube_world.fleet.fail_pod(TRAINING_NS, failing, exit_code=1,
                              message="ValueError: learning rate must be positive")

    # backoffLimit 0: the Job fails on its first failed pod, the JobSet
    # (no restarts) with it, then the TrainJob. The failed pod, and its
    # exit code, stay.
    eventually(lambda: condition_true(kube_world.trainjob(name), "Failed"), timeout=60,
               interval=0.2, what="the Trainer to mark the TrainJob Failed")
    assert pod_phase(kube_world, failing) == "Failed"
    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.FAILED, (job.phase, job.last_error)
    assert attempt.failure_class == "code" and attempt.exit_code == 1
    assert job.attempts.count() == 1  # never relaunched
    # A code error: no node is blamed, though the Job controller deleted the
    # other rank's pod when the Job failed.
    placed = attempt.placements.values_list("node__name", flat=True)
    assert not any(kube_world.core.read_node(n).spec.unschedulable for n in placed)
    # Its TrainJob is deleted, and everything it made with it.
    eventually(lambda: kube_world.trainjob(name) is None, timeout=60, interval=0.2,
               what="the TrainJob to go")
    eventually(lambda: not gang(kube_world, name), timeout=60, interval=0.2,
               what="its pods to go")


def test_cancel_deletes_the_trainjob_and_garbage_collection_takes_the_rest(db, kube_world, fsx):
    job, attempt, name, pods, now = running_job(kube_world, fsx)

    job.request_cancel("owner", now=later(now, 1))
    reconcile_job_unlocked(job.id, later(now, 2))

    eventually(lambda: kube_world.trainjob(name) is None, timeout=60, interval=0.2,
               what="the TrainJob to go")
    eventually(lambda: kube_world.jobset(name) is None, timeout=60, interval=0.2,
               what="its JobSet to go")
    eventually(lambda: not gang(kube_world, name), timeout=60, interval=0.2,
               what="its pods to go")
    jobs = k8s.BatchV1Api(kube_world.admin).list_namespaced_job(
        TRAINING_NS, label_selector=f"{JOBSET_LABEL}={name}").items
    assert not jobs
    secrets = kube_world.core.list_namespaced_secret(TRAINING_NS).items
    assert f"{name}-token" not in {s.metadata.name for s in secrets}
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED


def test_a_node_that_goes_not_ready_is_cordoned_and_the_trainjob_relaunched_on_healthy_nodes(
        db, kube_world, fsx):
    job, attempt, name, pods, now = running_job(kube_world, fsx)
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

    assert kube_world.core.read_node(bad).spec.unschedulable is True
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.state in JobAttempt.ENDED and attempt.failure_class == "hardware"
    second = job.attempts.get(number=2)
    assert second.provider_ref["kind"] == "TrainJob"
    new_nodes = set(second.placements.values_list("node__name", flat=True))
    assert bad not in new_nodes and len(new_nodes) == 2
    second_name = second.provider_ref["name"]
    relaunched = eventually(lambda: running_pods(kube_world, second_name, 2), timeout=60,
                            interval=0.2, what="the relaunch's pods to run")
    assert {p.spec.node_name for p in relaunched.values()} == new_nodes
    eventually(lambda: kube_world.trainjob(name) is None and not gang(kube_world, name),
               timeout=60, interval=0.2, what="the first attempt's TrainJob and pods to go")



def test_a_rank_killed_with_no_sign_from_its_node_is_relaunched_in_place(db, kube_world, fsx):
    job, attempt, name, pods, now = running_job(kube_world, fsx)
    placed = set(attempt.placements.values_list("node__name", flat=True))
    # SIGKILL (the OOM killer, a `kill -9`), no crash report: the Job fails,
    # and the Job controller deletes the other rank's running pod.
    kube_world.fleet.fail_pod(TRAINING_NS, pods[0].metadata.name, exit_code=137,
                              reason="OOMKilled")
    eventually(lambda: condition_true(kube_world.trainjob(name), "Failed"), timeout=60,
               interval=0.2, what="the Trainer to mark the TrainJob Failed")
    eventually(lambda: len(gang(kube_world, name)) == 1, timeout=60, interval=0.2,
               what="the Job controller to delete the other rank's pod")
    reconcile_job_unlocked(job.id, later(now, 5))

    attempt.refresh_from_db()
    # Only the killed rank's node is suspected, and nothing says it is bad:
    # a process failure, relaunched on the same nodes, none cordoned.
    assert attempt.failure_class == "process", attempt.failure_reason
    assert not any(kube_world.core.read_node(n).spec.unschedulable for n in placed)
    second = job.attempts.get(number=2)
    assert set(second.placements.values_list("node__name", flat=True)) == placed
    relaunched = eventually(lambda: running_pods(kube_world, second.provider_ref["name"], 2),
                            timeout=60, interval=0.2, what="the relaunch's pods to run")
    assert {p.spec.node_name for p in relaunched.values()} == placed


def test_an_image_that_cannot_be_pulled_fails_the_trainjob_as_the_users_error(
        db, kube_world, fsx):
    from testcluster.stages import MISSING_IMAGE

    pool = gpu_pool(kube_world)
    cluster = v2_cluster(kube_world, pool, fsx)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    job = submit(cluster, team_with_quota(cluster, gpus=24), nodes=2, gpus=8,
                 image=MISSING_IMAGE, storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    name = job.attempts.get().provider_ref["name"]

    def pull_failed():
        pods = gang(kube_world, name).values()
        return len(pods) == 2 and all(
            p.status.container_statuses and p.status.container_statuses[0].state.waiting
            for p in pods)

    eventually(pull_failed, timeout=60, interval=0.2, what="the image pull to fail")
    reconcile_job_unlocked(job.id, later(now, job.cluster.config.observe_interval_s))
    job.refresh_from_db()
    attempt = job.attempts.get()
    assert job.phase == Phase.FAILED
    assert attempt.failure_class == "code"
    assert "ErrImagePull" in attempt.failure_reason and MISSING_IMAGE in job.last_error
    eventually(lambda: kube_world.trainjob(name) is None, timeout=60, interval=0.2,
               what="the TrainJob to go")


def test_a_spot_notice_drains_the_node_and_relaunches_the_trainjob_elsewhere(
        db, kube_world, fsx):
    from jobs.models import JobEvent
    from testcluster.fleet import SPOT_ITN_TAINT

    job, attempt, name, pods, now = running_job(
        kube_world, fsx, pool_settings={"node_autoscaler": "karpenter"},
        cluster_settings={"spot_checkpoint_wait_s": 5})
    placed = list(attempt.placements.order_by("node_rank").values_list("node__name", flat=True))
    doomed = placed[1]
    # What AWS Node Termination Handler does on EC2's two-minute notice.
    kube_world.fleet.taint(doomed, SPOT_ITN_TAINT)

    def noticed():
        # The taint reaches the pass through the node informer's watch.
        reconcile_cluster_unlocked(job.cluster_id, later(now, 1))
        return NodeHealthEvent.objects.filter(node__name=doomed).exists()

    eventually(noticed, timeout=10, interval=0.2, what="the pass to see the taint")
    reconcile_job_unlocked(job.id, later(now, 2))
    assert JobEvent.objects.filter(job=job, kind="EmergencyCheckpointRequested").exists()

    # The trainer's emergency checkpoint is not played here: the wait runs
    # out, and the job resumes from its newest checkpoint elsewhere.
    heartbeat(attempt, 2, later(now, 7))
    reconcile_job_unlocked(job.id, later(now, 8))

    attempt.refresh_from_db()
    assert attempt.failure_class == "preempted", attempt.failure_reason
    assert kube_world.core.read_node(doomed).spec.unschedulable is True
    second = job.attempts.get(number=2)
    new_nodes = set(second.placements.values_list("node__name", flat=True))
    assert doomed not in new_nodes and len(new_nodes) == 2
    # A Karpenter pool: the relaunch's pods are placed by the pool's labels,
    # kept off the doomed node, and land on the nodes Regatta preferred.
    relaunched = eventually(lambda: running_pods(kube_world, second.provider_ref["name"], 2),
                            timeout=60, interval=0.2, what="the relaunch's pods to run")
    assert {p.spec.node_name for p in relaunched.values()} == new_nodes
    eventually(lambda: kube_world.trainjob(name) is None and not gang(kube_world, name),
               timeout=60, interval=0.2, what="the first attempt's TrainJob and pods to go")


# --- the allreduce preflight as a TrainJob ---------------------------------------

def preflight_pods(world, count):
    """The preflight TrainJob's name and its pods by rank, once all run."""
    names = [j["metadata"]["name"] for j in world.custom.list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", TRAINING_NS, "trainjobs")["items"]
        if j["metadata"]["name"].startswith("regatta-preflight-")]
    if len(names) != 1:
        return None
    pods = running_pods(world, names[0], count)
    return (names[0], pods) if pods else None


@pytest.mark.parametrize("broken_rank", [None, 1])
def test_the_allreduce_preflight_runs_as_a_trainjob_and_names_a_failed_node(
        kube_world, broken_rank):
    """With Trainer v2 alone, the default preflight: a TrainJob against the
    same runtime, one pod per chosen node. The Trainer, JobSet and the Job
    controller make its pods, the scheduler puts them on the chosen nodes;
    a test plays what kwok cannot (each container's output and exit)."""
    calls = Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))
    pool, info = kwok_pool(kube_world, size=2)
    provider = provider_for(calls, job_api="trainjob")
    logs = PodLogs().install(provider)
    placements = (Placement(pool.node_name(0), 0), Placement(pool.node_name(1), 1))
    first = started_preflight(provider, info, placements, timeout_s=90)
    name, pods = eventually(lambda: preflight_pods(kube_world, 2), timeout=90, interval=0.2,
                            what="the preflight's pods to run")
    assert {p.spec.node_name for p in pods.values()} == {pool.node_name(0), pool.node_name(1)}
    (container,) = pods[0].spec.containers
    assert container.command[:2] == ["torchrun", "--no-python"]
    env = {e.name: e.value for e in container.env}
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1"
    for rank, pod in pods.items():
        logs.text[(TRAINING_NS, pod.metadata.name)] = (
            "RuntimeError: NCCL error\n" if rank == broken_rank
            else f'{{"rank": {rank}, "ok": true, "busbw_gbps": {40 + rank}.5}}\n')
    if broken_rank is None:
        for pod in pods.values():
            kube_world.fleet.succeed_pod(TRAINING_NS, pod.metadata.name)
    else:
        kube_world.fleet.fail_pod(TRAINING_NS, pods[broken_rank].metadata.name, exit_code=1,
                                  message="RuntimeError: NCCL error")
    assert first.evidence["job"] == name
    result = preflight_result(provider, info, placements, timeout_s=90)
    if broken_rank is None:
        assert result.ok, result.message
        assert result.evidence["allreduce_gbps"] == 40.5
        assert set(result.evidence["per_node"]) == {pool.node_name(0), pool.node_name(1)}
    else:
        broken_node = pods[broken_rank].spec.node_name
        assert not result.ok and result.failed_nodes == (broken_node,)
        assert broken_node in result.message
    # Each later call found the check by the placements' label; nothing
    # watched it, and no call waited on it.
    looks = calls.calls(
        "GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{TRAINING_NS}/trainjobs")
    assert f"{LABEL_CHECKS}={checks_label(placements)}" in {
        c.query.get("labelSelector") for c in looks}
    assert not [c for c in looks if c.query.get("watch") == "True"]
    # The check cleans up after itself: the TrainJob, and by garbage
    # collection its JobSet, Job and pods.
    eventually(lambda: kube_world.trainjob(name) is None and not kube_world.pods(
        f"{JOBSET_LABEL}={name}"), timeout=60, interval=0.2, what="the preflight to go")
