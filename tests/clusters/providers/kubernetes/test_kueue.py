"""Kueue admitting Regatta's gangs (`gang_scheduler: kueue`), for real.

The test cluster runs Kueue's controller and its webhooks
(testcluster/kueue.py) beside the training-operator, Trainer v2 and JobSet.
Regatta admits a job under its team quota and places it, then makes the
PyTorchJob or TrainJob with the LocalQueue's label; Kueue's webhook
suspends it, its Workload waits for the ClusterQueue's quota, and only then
does Kueue let it start. Each test makes its own pool, ResourceFlavor,
ClusterQueue and LocalQueue (tests/support/kube_cluster.py). As elsewhere,
a test plays what kwok cannot: the trainer's heartbeats.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from clusters.models import Node
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import Phase
from jobs.reconcile import reconcile_job_unlocked
from testcluster import bootstrap
from tests.fleet_helpers import heartbeat, later, launch, submit, team_with_quota
from tests.support.kube_calls import Recorder
from tests.support.kube_cluster import TRAINING_NS
from tests.support.waiting import eventually

from .test_provider import (
    kwok_pool,
    launch_running,
    provider_for,
    request_on,
)
from .test_real_cluster import gpu_pool, kube_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

IMAGE = "registry.example/trainer:2.1"
# The label each kind's pods carry with the attempt's name.
POD_LABEL = {"pytorchjob": "training.kubeflow.org/job-name",
             "trainjob": "jobset.sigs.k8s.io/jobset-name"}
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload_of(world, job_obj):
    uid = job_obj["metadata"]["uid"]
    found = [w for w in world.workloads()
             if w["metadata"].get("labels", {}).get(JOB_UID_LABEL) == uid]
    return found[0] if found else None


def condition(obj, kind):
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond
    return None


def job_object(world, job_api, name):
    return world.pytorchjob(name) if job_api == "pytorchjob" else world.trainjob(name)


def suspended(job_api, obj) -> bool:
    spec = obj["spec"]
    return bool((spec.get("runPolicy") or {}).get("suspend") if job_api == "pytorchjob"
                else spec.get("suspend"))


def running_pods(world, job_api, name, count):
    pods = world.pods(f"{POD_LABEL[job_api]}={name}")
    if len(pods) == count and all(p.status.phase == "Running" for p in pods):
        return pods
    return None


def kueue_cluster(world, fsx, job_api, pool_size, queue_gpus):
    pool = gpu_pool(world, size=pool_size)
    queue = world.make_queue(pool, gpus=queue_gpus)
    cluster = kube_cluster(world, pool, fsx, job_api=job_api, gang_scheduler="kueue",
                           queue=queue)
    return pool, queue, cluster


def launched(cluster, team, fsx, name, now):
    """A two-node job Regatta admitted and launched: the job, its attempt and
    the attempt's name (its PyTorchJob's or TrainJob's)."""
    job = submit(cluster, team, name=name, nodes=2, gpus=8, image=IMAGE,
                 storage_uri=str(fsx / name))
    launch(job, now)
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    return job, attempt, attempt.provider_ref["name"]


@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
def test_a_job_kueue_holds_for_quota_waits_with_kueues_reason_and_starts_once_quota_frees(
        db, kube_world, fsx, job_api):
    # Kueue's ClusterQueue has 16 GPUs, two nodes' worth, of a pool of four;
    # Regatta's team quota has room for both jobs.
    pool, queue, cluster = kueue_cluster(kube_world, fsx, job_api, pool_size=4, queue_gpus=16)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=32)

    first, first_attempt, first_name = launched(cluster, team, fsx, "first", later(now, 1))
    obj = job_object(kube_world, job_api, first_name)
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    # Admitted by Kueue, so its pods run where Regatta placed them.
    pods = eventually(lambda: running_pods(kube_world, job_api, first_name, 2), timeout=90,
                      interval=0.2, what="the first job's pods to run")
    placed = set(first_attempt.placements.values_list("node__name", flat=True))
    assert {p.spec.node_name for p in pods} == placed
    admitted = workload_of(kube_world, job_object(kube_world, job_api, first_name))
    assert condition(admitted, "Admitted")["status"] == "True"
    heartbeat(first_attempt, 1, later(now, 5))
    reconcile_job_unlocked(first.id, later(now, 6))
    first.refresh_from_db()
    assert first.phase == Phase.RUNNING

    # The second: Regatta admits and places it, Kueue's quota is spent.
    second, attempt, name = launched(cluster, team, fsx, "second", later(now, 7))
    assert set(attempt.placements.values_list("node__name", flat=True)).isdisjoint(placed)

    def held():
        obj = job_object(kube_world, job_api, name)
        wl = workload_of(kube_world, obj) if obj else None
        reserved = condition(wl, "QuotaReserved")
        if reserved and reserved["status"] == "False" and reserved.get("message"):
            return obj, reserved["message"]
        return None

    obj, message = eventually(held, timeout=60, interval=0.2,
                              what="Kueue to hold the second job for quota")
    assert "insufficient unused quota for nvidia.com/gpu" in message
    assert suspended(job_api, obj)
    assert not kube_world.pods(f"{POD_LABEL[job_api]}={name}")

    # Regatta reads Kueue's own words as the wait's reason.
    reconcile_job_unlocked(second.id, later(now, 10))
    second.refresh_from_db()
    assert second.phase == Phase.STARTING
    assert "KueuePending" in second.pending_reason
    assert "insufficient unused quota for nvidia.com/gpu" in second.pending_reason
    wait = second.events.filter(kind="WaitingToStart").get()
    assert wait.evidence["issues"][0]["reason"] == "KueuePending"

    # A wait, not a hang: long past the first-heartbeat deadline it is
    # still the same attempt, waiting for Kueue.
    reconcile_job_unlocked(second.id, later(now, 3600))
    second.refresh_from_db()
    assert second.phase == Phase.STARTING
    assert second.attempts.count() == 1
    assert "KueuePending" in second.pending_reason

    # The first job ends: its Workload finishes, Kueue admits the second,
    # which starts on the nodes Regatta placed it on.
    first.request_cancel("owner", now=later(now, 3601))
    reconcile_job_unlocked(first.id, later(now, 3602))
    pods = eventually(lambda: running_pods(kube_world, job_api, name, 2), timeout=120,
                      interval=0.2, what="Kueue to admit the second job and its pods to run")
    assert {p.spec.node_name for p in pods} == set(
        attempt.placements.values_list("node__name", flat=True))
    assert not suspended(job_api, job_object(kube_world, job_api, name))
    heartbeat(attempt, 1, later(now, 3610))
    reconcile_job_unlocked(second.id, later(now, 3611))
    second.refresh_from_db()
    assert second.phase == Phase.RUNNING
    assert second.pending_reason == ""


def test_a_job_whose_local_queue_does_not_exist_waits_with_kueues_reason(
        db, kube_world, fsx):
    """Kueue refuses what Regatta admitted for a reason of its own set-up:
    the wait says so instead of timing out as a hang."""
    pool = gpu_pool(kube_world, size=2)
    cluster = kube_cluster(kube_world, pool, fsx, gang_scheduler="kueue", queue="no-such-queue")
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=16)
    job, _, name = launched(cluster, team, fsx, "train", later(now, 1))

    def held():
        wl = workload_of(kube_world, kube_world.pytorchjob(name))
        return wl if condition(wl, "QuotaReserved") else None

    eventually(held, timeout=60, interval=0.2, what="Kueue's Workload to say why")
    reconcile_job_unlocked(job.id, later(now, 3600))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    assert job.attempts.count() == 1
    assert "KueuePending" in job.pending_reason
    assert "no-such-queue" in job.pending_reason
    assert not kube_world.pods(f"{POD_LABEL['pytorchjob']}={name}")


def test_the_provider_reads_the_workload_by_job_uid_and_stops_once_the_gang_started(kube_world):
    """What the provider asks of the server (deploy/'s token): while the gang
    waits it lists Kueue's Workloads by the job-uid label, as v1beta1 (the
    API server converts through Kueue's conversion webhook); once Kueue
    admitted it and the operator started it, observe no longer looks."""
    calls = Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))
    pool, info = kwok_pool(kube_world, size=2)
    queue = kube_world.make_queue(pool, gpus=8)
    provider = provider_for(calls, gang_scheduler="kueue", queue=queue)
    held = request_on(pool, info, name="job-7-a1")
    # 16 GPUs against a ClusterQueue of 8: Kueue holds it ("insufficient quota
    # ... > maximum capacity (8)").
    held_ref = provider.launch(held)

    def waiting():
        waits = provider.observe(held_ref).waits
        return waits[0] if waits and "quota for nvidia.com/gpu" in waits[0].message else None

    wait = eventually(waiting, timeout=60, interval=0.5, what="Kueue's reason")
    assert (wait.reason, wait.node_rank) == ("KueuePending", None)
    uid = kube_world.pytorchjob(held.name)["metadata"]["uid"]
    listed = calls.calls("GET", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{TRAINING_NS}/workloads")
    assert listed and {c.query["labelSelector"] for c in listed} == {
        f"kueue.x-k8s.io/job-uid={uid}"}
    assert {c.status for c in listed} == {200}

    fits = request_on(pool, info, count=1, name="job-8-a1", job_id=8, attempt_id=22)
    ref, _ = launch_running(kube_world, provider, fits)
    before = len(calls.calls("GET", "/apis/kueue.x-k8s.io/"))
    assert provider.observe(ref).start_issues == ()
    assert len(calls.calls("GET", "/apis/kueue.x-k8s.io/")) == before


@pytest.mark.parametrize("job_api", ["pytorchjob", "trainjob"])
def test_a_job_kueue_takes_back_is_a_preemption_relaunched_through_kueue(
        db, kube_world, fsx, job_api):
    """Kueue takes back an admitted, running job (here its Workload is
    deactivated, as `kueuectl stop workload` does; a preemption evicts the
    same way): it suspends the job and its pods go. Regatta reads Kueue's
    Evicted condition: a preemption, charged to no budget, no node blamed
    or cordoned, and the relaunch, on the same nodes, goes through Kueue
    again."""
    pool, queue, cluster = kueue_cluster(kube_world, fsx, job_api, pool_size=2, queue_gpus=16)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=16)
    job, attempt, name = launched(cluster, team, fsx, "train", later(now, 1))
    eventually(lambda: running_pods(kube_world, job_api, name, 2), timeout=90,
               interval=0.2, what="the pods to run")
    heartbeat(attempt, 1, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 6))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING

    wl = workload_of(kube_world, job_object(kube_world, job_api, name))
    kube_world.custom.patch_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", wl["metadata"]["namespace"], "workloads",
        wl["metadata"]["name"], {"spec": {"active": False}})
    eventually(lambda: suspended(job_api, job_object(kube_world, job_api, name))
               and not kube_world.pods(f"{POD_LABEL[job_api]}={name}"),
               timeout=60, interval=0.2, what="Kueue to suspend the job and its pods to go")

    for step in range(4):
        reconcile_job_unlocked(job.id, later(now, 10 + step))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.failure_class == "preempted"
    assert "Kueue evicted the workload" in attempt.failure_reason
    assert not (job.budget_spent or {}).get("preempted")
    assert not job.events.filter(kind__in=["NodeFailed", "RankDied", "NodePreempted"]).exists()
    assert not Node.objects.filter(cluster=cluster, state=Node.State.CORDONED).exists()
    assert not Node.objects.filter(cluster=cluster, failure_count__gt=0).exists()
    second = job.attempts.get(number=2)
    assert set(second.placements.values_list("node__name", flat=True)) == set(
        attempt.placements.values_list("node__name", flat=True))
    # The deactivated Workload gave its quota back: Kueue admits the new one.
    new = second.provider_ref["name"]
    assert job_object(kube_world, job_api, new)["metadata"]["labels"][
        "kueue.x-k8s.io/queue-name"] == queue
    eventually(lambda: running_pods(kube_world, job_api, new, 2), timeout=90,
               interval=0.2, what="Kueue to admit the relaunch")
