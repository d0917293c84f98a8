"""Blame only with evidence, on the real test cluster and both job APIs
(PyTorchJob through the training-operator, TrainJob through Trainer v2 and
JobSet): the job reconcile and the cluster reconcile run as in production
(tests/support/kube_cluster.py), against faults staged in the cluster
itself:

- a program that exits 1 on every rank in every attempt ends in a crash
  loop with its own error line, and no node leaves service;
- a stalled kube-apiserver, then the node lifecycle controller's brief
  NodeStatusUnknown, retire no healthy node and requeue no job;
- a rank the scheduler put elsewhere than planned, whose node is then
  deleted: the node it ran on is blamed, never the planned one;
- the same Node NotReady a second time, after it was Ready again: the
  second spell is a failure again once it lasts the grace;
- an admin's `kubectl cordon` of an idle node takes it out of Regatta's
  placement at once, and their uncordon brings it back;
- a failed rank's log that pods/log cannot fetch is acted on without it,
  and read once more later for the job's timeline.

kwok plays the kubelets and runs no containers: a test says when a
container exits and what it printed (testcluster/fleet.py), and writes
the node statuses a kubelet or the node lifecycle controller would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime

import pytest
from django.utils import timezone
from kubernetes import client as k8s

from clusters.models import Node, NodeEvent, NodeHealthEvent, NodePool
from clusters.providers import get_provider, pool_info
from clusters.reconcile import CLUSTERS, reconcile_cluster_unlocked
from clusters.reconcile.follow import HELD
from clusters.reconcile.returns import request_return
from controlplane.lib import runner
from jobs.admission import admit
from jobs.models import JobAttempt, Phase, TrainingJob
from jobs.reconcile import JOBS, reconcile_job_unlocked
from testcluster.stages import NOT_READY_ANNOTATION, NOT_READY_LABEL
from tests.fleet_helpers import heartbeat, later, launch, submit, team_with_quota
from tests.support.kube_cluster import TRAINING_NS
from tests.support.pod_logs import PodLogs
from tests.support.waiting import eventually

from .test_real_cluster import (
    OPERATOR_JOB_LABEL,
    gpu_pool,
    kube_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS = TRAINING_NS
APIS = ["pytorchjob", "trainjob"]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
IMAGE = "registry.example/trainer:2.1"


# --- the cluster, the job and its pods ------------------------------------------------

def fleet(world, fsx, job_api, size, *, pool_settings=None, **settings):
    """A kwok pool of `size` nodes, the cluster row for it (`job_api`), and
    the first cluster pass, which makes the node rows."""
    pool = gpu_pool(world, size=size)
    cluster = kube_cluster(world, pool, fsx, job_api=job_api, **settings)
    if pool_settings:
        NodePool.objects.filter(cluster=cluster).update(settings=pool_settings)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    return pool, cluster, now


def pods_by_rank(world, job_api, name) -> dict:
    """The attempt's pods by node rank: a PyTorchJob's Master is 0 and
    Worker i is i + 1; a TrainJob's pod is its Job completion index."""
    if job_api == "trainjob":
        return {int(p.metadata.labels[INDEX_LABEL]): p
                for p in world.pods(f"{JOBSET_LABEL}={name}")}
    out = {}
    for pod in world.pods(f"{OPERATOR_JOB_LABEL}={name}"):
        labels = pod.metadata.labels
        index = int(labels["training.kubeflow.org/replica-index"])
        out[0 if labels["training.kubeflow.org/replica-type"] == "master" else index + 1] = pod
    return out


def running_pods(world, job_api, name, count) -> dict:
    def running():
        pods = pods_by_rank(world, job_api, name)
        if len(pods) == count and all(p.status.phase == "Running" for p in pods.values()):
            return pods
        return None
    return eventually(running, timeout=90, interval=0.2, what=f"{name}'s pods to run")


def passes(job, what, until, start, *, step=15.0, timeout=120):
    """Drive the job's passes (and its cluster's admission) forward in time,
    `step` seconds apart, until `until()`; returns the clock reached."""
    clock = [start]

    def once():
        clock[0] = later(clock[0], step)
        admit(job.cluster_id, clock[0])
        reconcile_job_unlocked(job.id, clock[0])
        job.refresh_from_db()
        return until()

    eventually(once, timeout=timeout, interval=0.3, what=what)
    return clock[0]


def launched(job, number):
    """Attempt `number` of the job, once its job object was made."""
    attempt = job.attempts.filter(number=number).first()
    return attempt if attempt is not None and attempt.provider_ref else None


def out_of_service_acts(cluster) -> list[tuple[str, str]]:
    """(node, state) of every time a node of the cluster left service."""
    return list(NodeEvent.objects.filter(
        node__cluster=cluster,
        to_state__in=[Node.State.CORDONED, Node.State.FAILED, Node.State.REPLACED,
                      Node.State.DRAINING, Node.State.TERMINATED],
    ).values_list("node__name", "to_state"))


# --- (a) a crash loop is the job's -------------------------------------------------------

def torchrun_log(rank: int) -> str:
    """What a failed node's container prints: the program's traceback, with
    a chatty loop before it, then torchrun's report of how its rank ended."""
    own = [f"[rank{rank}]: a chatty training loop says a lot of things"] * 30
    return "\n".join([
        *own,
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/workspace/train.py", line 41, in <module>',
        f'[rank{rank}]:     raise ValueError("bad learning rate: -1")',
        f"[rank{rank}]: ValueError: bad learning rate: -1",
        "E1128 17:17:12.680000 18142 torch/distributed/elastic/multiprocessing/api.py:874] "
        "failed (exitcode: 1) local_rank: 0 (pid: 18143) of binary: /usr/bin/python3",
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=" * 60,
        "/workspace/train.py FAILED",
        "-" * 60,
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-28_17:17:12",
        f"  rank      : {rank} (local_rank: 0)",
        "  exitcode  : 1 (pid: 18143)",
        "=" * 60,
    ]) + "\n"


@pytest.mark.parametrize("job_api", APIS)
def test_a_program_that_exits_1_on_every_rank_every_time_ends_in_a_crash_loop_and_keeps_the_fleet(
        db, kube_world, fsx, job_api):
    pool, cluster, now = fleet(kube_world, fsx, job_api, size=3)
    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image=IMAGE, storage_uri=str(fsx / "train"),
                 entrypoint=["python", "/workspace/train.py"],
                 completion=TrainingJob.Completion.EXIT)
    launch(job, later(now, 1))
    clock = later(now, 1)
    loop = cluster.config.crash_loop_failures
    for number in range(1, loop + 1):
        if number > 1:
            clock = passes(job, f"attempt {number} to launch",
                           lambda n=number: launched(job, n) is not None, clock)
        attempt = launched(job, number)
        assert attempt is not None, (job.phase, job.pending_reason, job.last_error)
        name = attempt.provider_ref["name"]
        for rank, pod in running_pods(kube_world, job_api, name, 2).items():
            try:
                kube_world.fleet.fail_pod(NS, pod.metadata.name, exit_code=1,
                                          message=torchrun_log(rank * 8))
            except k8s.ApiException as exc:
                # A TrainJob's Job (backoffLimit 0) removes the gang's other
                # pods once one failed: nothing left to fail.
                if exc.status != 404:
                    raise
        clock = passes(job, f"attempt {number}'s failure to be acted on",
                       lambda a=attempt: JobAttempt.objects.get(pk=a.pk).state
                       in JobAttempt.ENDED, clock)

    job.refresh_from_db()
    assert job.phase == Phase.FAILED, (job.phase, job.last_error)
    assert job.attempts.count() == loop
    assert set(job.attempts.values_list("failure_class", flat=True)) == {"process"}
    assert job.last_error.startswith(f"crash loop: the same failure {loop} times in a row")
    # The user's own error line and traceback, found above torchrun's report.
    assert "ValueError: bad learning rate: -1" in job.last_error
    assert 'raise ValueError("bad learning rate: -1")' in job.last_error
    crash = job.events.get(kind="CrashLoop")
    assert crash.evidence["error"]["line"] == "ValueError: bad learning rate: -1"
    # Not one node left service, in Regatta or in Kubernetes.
    rows = Node.objects.filter(cluster=cluster)
    assert {(n.name, n.state, n.failure_count) for n in rows} == {
        (pool.node_name(i), Node.State.READY, 0) for i in range(3)}
    assert out_of_service_acts(cluster) == []
    assert not {"NodeFailed", "NodeCordoned", "NodeReplaced"} & set(
        job.events.values_list("kind", flat=True))
    assert not any(kube_world.core.read_node(pool.node_name(i)).spec.unschedulable
                   for i in range(3))


# --- (c) the node a rank really ran on --------------------------------------------------

def occupy(world, node: str) -> None:
    """Another tenant's pod holding all eight GPUs of `node` (bound to it
    directly): Regatta's rows do not know of it, the scheduler does."""
    world.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"tenant-{node}"},
        "spec": {"nodeName": node, "containers": [{
            "name": "c", "image": "registry.example/other:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})


@pytest.fixture
def tenant_pods(kube_world):
    made = []
    yield made
    for node in made:
        try:
            kube_world.core.delete_namespaced_pod(f"tenant-{node}", "default",
                                                  grace_period_seconds=0)
        except Exception:  # noqa: BLE001 - gone with its node already
            pass


@pytest.mark.parametrize("job_api", APIS)
def test_a_rank_scheduled_elsewhere_than_planned_blames_the_node_it_ran_on(
        db, kube_world, fsx, tenant_pods, job_api):
    # A Karpenter pool: the planned nodes are preferred, any node of the pool
    # allowed, so the scheduler may put a rank on another node than planned.
    pool, cluster, now = fleet(kube_world, fsx, job_api, size=3,
                               pool_settings={"node_autoscaler": "karpenter"})
    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image=IMAGE, storage_uri=str(fsx / "train"))
    # The gang takes the pool's first two nodes by name; the second is full
    # with another tenant's pod, so one rank goes to the third.
    planned_full, spare_room = pool.node_name(1), pool.node_name(2)
    occupy(kube_world, planned_full)
    tenant_pods.append(planned_full)
    launch(job, later(now, 1))
    attempt = launched(job, 1)
    plan = dict(attempt.placements.values_list("node_rank", "node__name"))
    assert sorted(plan.values()) == [pool.node_name(0), planned_full]
    pods = running_pods(kube_world, job_api, attempt.provider_ref["name"], 2)
    # Which rank the scheduler moved depends on which pod it placed first.
    (moved,) = [r for r, p in pods.items() if p.spec.node_name == spare_room]
    ran_on, planned = spare_room, plan[moved]
    assert planned != ran_on
    clock = later(now, 5)
    heartbeat(attempt, 1, clock)
    reconcile_job_unlocked(job.id, clock)

    # The node it really ran on goes (a cloud's termination, Karpenter's).
    kube_world.core.delete_node(ran_on)

    def acted():
        nonlocal clock
        clock = later(clock, 1)
        heartbeat(attempt, 2, clock)
        reconcile_job_unlocked(job.id, clock)
        attempt.refresh_from_db()
        return attempt.state in JobAttempt.ENDED

    eventually(acted, timeout=30, interval=0.3, what="the lost rank to be acted on")
    assert attempt.failure_class == "hardware", attempt.failure_reason
    (failed,) = job.events.filter(kind="NodeFailed")
    assert failed.evidence["node"] == ran_on and "gone" in failed.evidence["node_lost"]
    gone = Node.objects.get(cluster=cluster, name=ran_on)
    assert gone.state in (Node.State.CORDONED, Node.State.REPLACED, Node.State.FAILED,
                          Node.State.TERMINATED)
    assert gone.failure_count == 1
    # The planned node, where the rank never ran, is untouched.
    kept = Node.objects.get(cluster=cluster, name=planned)
    assert (kept.state, kept.failure_count) == (Node.State.READY, 0)
    assert {name for name, _ in out_of_service_acts(cluster)} == {ran_on}
    assert not kube_world.core.read_node(planned).spec.unschedulable


# --- (d) the second NotReady spell of a node ------------------------------------------------

def make_ready_again(world, node: str) -> None:
    """The node's kubelet is back: kwok's NotReady stage lifted and Ready
    written True, with the lastTransitionTime kwok keeps (its creation)."""
    world.core.patch_node(node, {"metadata": {
        "labels": {NOT_READY_LABEL: None},
        "annotations": {f"{NOT_READY_ANNOTATION}/{k}": None
                        for k in ("reason", "message", "delay", "jitter-delay")}}})
    node_ready(world, node, "True", "KubeletReady", "kubelet is posting ready status")


def test_the_same_node_not_ready_a_second_time_fails_again(db, kube_world, fsx):
    """Node-level (no job runs on it, so the job API plays no part): each
    spell of NotReady that Regatta observes is its own, although kwok leaves
    the condition's lastTransitionTime as it was."""
    pool, cluster, now = fleet(kube_world, fsx, "pytorchjob", size=2)
    node = pool.node_name(1)
    grace = cluster.config.node_failure_grace_s
    provider, info = get_provider(cluster), pool_info(cluster.pools.get())
    clock = [now]

    def pass_at(seconds):
        clock[0] = later(clock[0], seconds)
        reconcile_cluster_unlocked(cluster.id, clock[0])
        return Node.objects.get(cluster=cluster, name=node)

    def spell(number):
        kube_world.fleet.make_not_ready(node)
        eventually(lambda: pass_at(1).not_ready_since is not None, timeout=30, interval=0.3,
                   what=f"spell {number} to be seen")
        row = pass_at(grace + 1)
        assert row.state in (Node.State.FAILED, Node.State.REPLACED), (number, row.state)
        assert row.health_events.filter(kind="lost").count() == number
        return ready_condition(kube_world, node).last_transition_time

    first_went = spell(1)
    # Mended: the kubelet back, and an operator's return to service (the pool
    # has no way to replace it).
    make_ready_again(kube_world, node)
    eventually(lambda: {n.name: n for n in provider.list_nodes(info)}[node].ready,
               timeout=30, interval=0.2, what="Regatta to see the node ready")
    assert request_return(Node.objects.get(cluster=cluster, name=node), actor="user:operator",
                          reason="kubelet restarted", now=later(clock[0], 1))
    eventually(lambda: pass_at(1).state == Node.State.READY, timeout=30, interval=0.3,
               what="the node to return to service")
    second_went = spell(2)

    assert first_went == second_went  # kwok kept the same lastTransitionTime
    row = Node.objects.get(cluster=cluster, name=node)
    assert row.failure_count == 2
    assert row.events.filter(to_state=Node.State.FAILED).count() == 2
    first, second = row.health_events.filter(kind="lost").order_by("created_at")
    assert first.evidence["since"] < second.evidence["since"]
    assert second.evidence["not_ready_for_s"] == grace + 1  # counted from the second spell


def ready_condition(world, node: str):
    return next(c for c in world.core.read_node(node).status.conditions if c.type == "Ready")


# --- (e) an admin's cordon ----------------------------------------------------------------

@pytest.mark.parametrize("job_api", APIS)
def test_an_admins_cordon_of_an_idle_node_takes_it_out_at_once_and_their_uncordon_returns_it(
        db, kube_world, fsx, job_api):
    pool, cluster, now = fleet(kube_world, fsx, job_api, size=2)
    held = pool.node_name(1)
    kube_world.core.patch_node(held, {"spec": {"unschedulable": True}})  # kubectl cordon

    def followed():
        reconcile_cluster_unlocked(cluster.id, later(now, 1))
        return Node.objects.get(cluster=cluster, name=held).state == Node.State.CORDONED

    eventually(followed, timeout=30, interval=0.3, what="the pass to follow the cordon")
    row = Node.objects.get(cluster=cluster, name=held)
    assert row.state_reason.startswith(f"{HELD}: cordoned in Kubernetes"), row.state_reason
    assert row.admin_hold.startswith("cordoned in Kubernetes")
    assert row.events.get(to_state=Node.State.CORDONED).actor == "scheduler"
    # Regatta's own mark is not put on an admin's cordon.
    assert not (kube_world.core.read_node(held).metadata.annotations or {}).get(
        "regatta.io/cordoned")

    # A job of two nodes cannot be placed on the one left: it waits, saying why.
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, image=IMAGE, storage_uri=str(fsx / "train"))
    launch(job, later(now, 2))
    job.refresh_from_db()
    assert job.phase == Phase.QUEUED and not job.attempts.exists(), job.phase
    assert job.pending_reason

    kube_world.core.patch_node(held, {"spec": {"unschedulable": False}})  # kubectl uncordon
    clock = later(now, 3)

    def back():
        nonlocal clock
        clock = later(clock, 1)
        reconcile_cluster_unlocked(cluster.id, clock)
        return Node.objects.get(cluster=cluster, name=held).state == Node.State.READY

    eventually(back, timeout=30, interval=0.3, what="the uncordon to bring the node back")
    row.refresh_from_db()
    assert row.admin_hold == "" and row.events.filter(
        reason__startswith="the scheduler's hold lifted").exists()
    clock = passes(job, "the job to launch", lambda: launched(job, 1) is not None, clock)
    attempt = launched(job, 1)
    assert set(attempt.placements.values_list("node__name", flat=True)) == {
        pool.node_name(0), held}
    pods = running_pods(kube_world, job_api, attempt.provider_ref["name"], 2)
    assert {p.spec.node_name for p in pods.values()} == {pool.node_name(0), held}


# --- a log that could not be read, read later for the record ---------------------------------

@pytest.mark.parametrize("job_api", APIS)
def test_a_log_unreadable_at_the_failure_is_acted_on_without_it_and_read_later(
        db, kube_world, fsx, monkeypatch, job_api):
    pool, cluster, now = fleet(kube_world, fsx, job_api, size=2)
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, image=IMAGE, storage_uri=str(fsx / "train"),
                 entrypoint=["python", "/workspace/train.py"],
                 completion=TrainingJob.Completion.EXIT)
    launch(job, later(now, 1))
    attempt = launched(job, 1)
    pods = running_pods(kube_world, job_api, attempt.provider_ref["name"], 2)
    failed = pods[1].metadata.name
    kube_world.fleet.fail_pod(NS, failed, exit_code=1)
    eventually(lambda: kube_world.core.read_namespaced_pod(failed, NS).status.phase == "Failed",
               timeout=30, interval=0.2, what="kwok to fail the container")
    # A kubelet with nothing to fall back to writes no termination message
    # (kwok writes one of its own), so the log must be read; and pods/log
    # reaches no kubelet here: the API server answers it with an error.
    kube_world.core.patch_namespaced_pod_status(failed, NS, [
        {"op": "remove", "path": "/status/containerStatuses/0/state/terminated/message"}])

    passes(job, "the failure to be acted on",
                   lambda: JobAttempt.objects.get(pk=attempt.pk).state in JobAttempt.ENDED,
                   later(now, 1), step=1)
    attempt.refresh_from_db()
    # Acted on with what was known, saying the log could not be read.
    where = pods[1].spec.node_name
    (died,) = [e for e in job.events.filter(kind="RankDied", attempt=attempt)
               if e.evidence.get("node") == where]
    assert died.evidence["log_tail"].startswith("(log unreachable"), died.evidence
    # The failed pod outlives its job object, kept for its log.
    gone = (kube_world.trainjob if job_api == "trainjob" else kube_world.pytorchjob)
    eventually(lambda: gone(attempt.provider_ref["name"]) is None, timeout=60, interval=0.2,
               what="the attempt's job object to go")
    kept = kube_world.core.read_namespaced_pod(failed, NS)
    assert kept.metadata.labels["regatta.io/log-kept"] == "true"
    assert not kept.metadata.owner_references
    kept_at = datetime.fromtimestamp(float(kept.metadata.annotations["regatta.io/log-kept-at"]),
                                     tz=UTC)

    # The kubelet answers again: the container's output, as tests/support/pod_logs.py plays it.
    logs = PodLogs({(NS, failed): torchrun_log(8)})
    monkeypatch.setattr(k8s.CoreV1Api, "read_namespaced_pod_log",
                        lambda self, name, namespace, **kw: logs.read(name, namespace, **kw))
    reconcile_cluster_unlocked(cluster.id, later(kept_at, 5))
    assert not job.events.filter(kind="LogReadLater").exists()  # not yet: 20 s after it was kept
    reconcile_cluster_unlocked(cluster.id, later(kept_at, 21))
    (late,) = job.events.filter(kind="LogReadLater")
    assert late.attempt_id == attempt.id
    assert late.message.endswith("ValueError: bad learning rate: -1")
    assert late.evidence["error"]["line"] == "ValueError: bad learning rate: -1"
    assert late.evidence["unreadable_at_failure"].startswith("(log unreachable")
    assert late.evidence["node_rank"] == 1
    assert [r["pod"] for r in logs.reads] == [failed]  # read once
    eventually(lambda: not [p for p in kube_world.pods("regatta.io/log-kept=true")],
               timeout=30, interval=0.2, what="the kept pod to go")
    reconcile_cluster_unlocked(cluster.id, later(kept_at, 60))
    assert job.events.filter(kind="LogReadLater").count() == 1


# --- (b) a stalled API server, then a brief NodeStatusUnknown ---------------------------
# Last in the file: the controllers' own watches (the operator's, kwok's)
# may take a while to recover from a stalled API server, and the tests
# after it would wait on them.

def node_ready(world, node: str, status: str, reason: str, message: str) -> None:
    """Write the node's Ready condition as its kubelet would, keeping its
    lastTransitionTime."""
    ready = ready_condition(world, node)
    world.core.patch_node_status(node, {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": timezone.now().isoformat(),
        "lastTransitionTime": ready.last_transition_time.isoformat()}]}})


def bounded(kind, obj_id, now) -> float:
    """One pass through the reconcile runner (lock, error classes) in a
    thread; how long it took. It must end, whatever the API server does."""
    out = {}

    def run():
        started = time.monotonic()
        try:
            runner.run(kind, obj_id, now)
        except Exception as exc:  # noqa: BLE001 - looked at below
            out["error"] = exc
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=40)
    assert not thread.is_alive(), f"a {kind.name} pass waited on the stalled API server"
    assert "error" not in out, out.get("error")
    return out["seconds"]


@pytest.mark.parametrize("job_api", APIS)
def test_a_stalled_api_server_and_a_brief_node_status_unknown_retire_no_node(
        db, kube_world, fsx, job_api):
    pool, cluster, now = fleet(kube_world, fsx, job_api, size=3, request_timeout_s=3)
    team = team_with_quota(cluster, gpus=24)
    job = submit(cluster, team, nodes=2, gpus=8, image=IMAGE, storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    attempt = launched(job, 1)
    running_pods(kube_world, job_api, attempt.provider_ref["name"], 2)
    clock, step = later(now, 5), 1
    heartbeat(attempt, step, clock)
    reconcile_job_unlocked(job.id, clock)
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING, job.last_error

    # kube-apiserver stops answering for ~20 s; the passes go on meanwhile.
    apiserver = kube_world.cluster.running()["kube-apiserver"]
    os.kill(apiserver, signal.SIGSTOP)
    try:
        stalled = time.monotonic()
        while time.monotonic() - stalled < 20:
            clock, step = later(clock, 2), step + 1
            heartbeat(attempt, step, clock)
            bounded(JOBS, job.id, clock)
            bounded(CLUSTERS, cluster.id, clock)
    finally:
        os.kill(apiserver, signal.SIGCONT)

    # Then, as the node lifecycle controller does after such a stall (its
    # lease reads went stale), every node not ready for a moment, with its
    # reason. (Through kwok's NotReady stage, as False: kwok answers a Ready
    # of Unknown by writing True at once.)
    names = [pool.node_name(i) for i in range(3)]
    for node in names:
        kube_world.fleet.make_not_ready(node, reason="NodeStatusUnknown",
                                        message="Kubelet stopped posting node status.")

    def seen_not_ready():
        nonlocal clock, step
        clock, step = later(clock, 1), step + 1
        heartbeat(attempt, step, clock)
        runner.run(CLUSTERS, cluster.id, clock)
        runner.run(JOBS, job.id, clock)
        return Node.objects.filter(cluster=cluster, not_ready_since__isnull=False).count() == 3

    eventually(seen_not_ready, timeout=120, interval=0.5,
               what="the passes to answer again and see the nodes not ready")
    for node in names:
        make_ready_again(kube_world, node)

    def seen_ready():
        nonlocal clock, step
        clock, step = later(clock, 1), step + 1
        heartbeat(attempt, step, clock)
        runner.run(CLUSTERS, cluster.id, clock)
        runner.run(JOBS, job.id, clock)
        return not Node.objects.filter(cluster=cluster, not_ready_since__isnull=False).exists()

    eventually(seen_ready, timeout=60, interval=0.5, what="the nodes to be seen ready again")

    # Within the grace: a state seen, nothing failed, nothing retired.
    assert (clock - now).total_seconds() > 20
    rows = Node.objects.filter(cluster=cluster)
    assert {(n.name, n.state, n.failure_count) for n in rows} == {
        (name, Node.State.READY, 0) for name in names}
    assert out_of_service_acts(cluster) == []
    assert not NodeHealthEvent.objects.filter(node__cluster=cluster).exists()
    assert all(n.events.filter(reason__startswith="ready again after").exists() for n in rows)
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING and job.attempts.count() == 1, job.last_error
    assert not any(kube_world.core.read_node(n).spec.unschedulable for n in names)
