"""What holds a gang back before any process runs, read from the pods, the
PyTorchJob and Volcano's PodGroup (Kueue's Workload: test_kubernetes_kueue.py,
on the real Kueue).

Where the test cluster can produce the state, the tests read it from the
real API server (tests/support/kube_cluster.py): kwok's kubelet failing an
image pull, the real scheduler leaving a pod Unschedulable (another
tenant's pod holds the GPUs), the operator's own conditions.

Still on tests/support/k8s_standin.py, for what the test cluster has no
component for: Volcano's PodGroups (the Go module proxy refuses every
version of volcano.sh/volcano, 403, so it cannot be built here), and the kubelet
states kwok has no stage for (CreateContainerConfigError for a missing
Secret, a registry's 429, ContainerCreating, our own token Secret arriving
late).
"""

import pytest
from django.utils import timezone
from kubernetes.client.exceptions import ApiException

from clusters.models import Cluster, NodePool
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes.observe import attempt_status, node_rank
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase
from jobs.reconcile import reconcile_job_unlocked
from testcluster import bootstrap
from testcluster.stages import MISSING_IMAGE
from tests.fleet_helpers import later, launch, submit, team_with_quota
from tests.support import k8s_standin as st
from tests.support.kube_calls import record_every_provider
from tests.support.waiting import eventually

from .test_karpenter import kube_cluster as karpenter_cluster
from .test_manifests import make_pool, make_request
from .test_provider import pods_by_node
from .test_real_cluster import condition_true

NS = "regatta-training"
JOBS = st.pytorchjobs(NS)
PODS = st.namespaced(NS, "pods")
GROUP = {"eks.amazonaws.com/nodegroup": "h100"}
PULL_NOT_FOUND = ('rpc error: code = NotFound desc = failed to pull and unpack image '
                  '"registry.example/nope:1.0": failed to resolve reference '
                  '"registry.example/nope:1.0": registry.example/nope:1.0: not found')
NO_GPUS = ("0/4 nodes are available: 1 node(s) were unschedulable, 3 Insufficient "
           "nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No preemption victims "
           "found for incoming pod.")
GANG = ("2/2 tasks in gang unschedulable: pod group is not ready, 2 minAvailable, "
        "2 Pending; Pending: 2 Undetermined")
PLACES = [{"node": "n1", "node_rank": 0}, {"node": "n2", "node_rank": 1}]


@pytest.fixture
def standin():
    with st.K8sStandIn() as server:
        yield server


def created(standin, name="job-7-a2"):
    job = st.pytorchjobs(NS)
    obj = standin.put(job, {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                            "metadata": {"name": name, "namespace": NS},
                            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1},
                                                             "Worker": {"replicas": 1}}},
                            "status": {"conditions": [st.job_condition("Created")]}})
    return obj


# --- the pure reading of each shape ------------------------------------------------

@pytest.fixture
def regatta(kube_world):
    return KubernetesProvider(bootstrap.api_client(kube_world.regatta_kubeconfig),
                              KubeSettings(request_timeout_s=10))


def launched_on(world, provider, size=2, **request):
    """A PyTorchJob launched by Regatta on a kwok pool of its own, and its
    placements as the ref has them."""
    pool = world.make_pool(size=size)
    info = make_pool(name=pool.name, node_selector=pool.selector)
    ref = provider.launch(make_request(nodes=tuple(pool.node_name(i) for i in range(size)),
                                       pool=info, **request))
    return pool, ref


def as_served(world, name):
    """The PyTorchJob and its pods, as the API server's JSON."""
    pods = world.pods(f"training.kubeflow.org/job-name={name}")
    return world.pytorchjob(name), [world.admin.sanitize_for_serialization(p) for p in pods]


def waiting(world, name, count, reason):
    job, pods = as_served(world, name)
    states = [((p["status"].get("containerStatuses") or [{}])[0].get("state") or {})
              .get("waiting", {}).get("reason") for p in pods]
    return (job, pods) if len(pods) == count and states == [reason] * count else None


@pytest.mark.slow
def test_an_image_the_job_names_and_lacks_is_the_users_error(kube_world, regatta):
    """kwok's pod-image-pull-failed stage writes what a kubelet writes for an
    image the registry does not have (ErrImagePull); the kubelet's back-off
    then turns it into ImagePullBackOff, which the test writes as it would."""
    pool, ref = launched_on(kube_world, regatta, image=MISSING_IMAGE)
    job, pods = eventually(lambda: waiting(kube_world, "job-7-a2", 2, "ErrImagePull"),
                           timeout=60, interval=0.2, what="the image pull to fail")
    by_rank = {node_rank(p): p for p in pods}
    message = by_rank[0]["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert "NotFound" in message and MISSING_IMAGE in message
    status = attempt_status(job, [by_rank[0]], ref["placements"], own_secret="job-7-a2-token")
    assert status.state == "running"
    (issue,) = status.user_errors
    assert (issue.reason, issue.message, issue.node_rank) == ("ErrImagePull", message, 0)
    assert status.waits == ()

    back_off = f'Back-off pulling image "{MISSING_IMAGE}"'
    kube_world.core.patch_namespaced_pod_status(by_rank[1]["metadata"]["name"], NS, [
        {"op": "replace", "path": "/status/containerStatuses/0/state/waiting",
         "value": {"reason": "ImagePullBackOff", "message": back_off}}])
    job, pods = as_served(kube_world, "job-7-a2")
    worker = next(p for p in pods if node_rank(p) == 1)
    status = attempt_status(job, [worker], ref["placements"], own_secret="job-7-a2-token")
    (issue,) = status.user_errors
    assert (issue.reason, issue.message, issue.node_rank) == ("ImagePullBackOff", back_off, 1)
    assert status.waits == ()


@pytest.mark.parametrize("reason,message", [
    ("CreateContainerConfigError", 'secret "hf-token" not found'),
])
def test_a_config_object_the_job_names_and_lacks_is_the_users_error(standin, reason, message):
    job = created(standin)
    pods = [st.waiting_pod("job-7-a2", "Master", 0, node_name="n1", reason=reason,
                           message=message)]
    status = attempt_status(job, pods, PLACES, own_secret="job-7-a2-token")
    assert status.state == "running"
    (issue,) = status.user_errors
    assert (issue.reason, issue.message, issue.node_rank) == (reason, message, 0)
    assert status.waits == ()


def test_a_throttled_registry_and_our_own_late_token_secret_are_waits(standin):
    job = created(standin)
    pods = [
        st.waiting_pod("job-7-a2", "Master", 0, node_name="n1", reason="ErrImagePull",
                       message="failed to pull: 429 toomanyrequests: rate limit exceeded"),
        st.waiting_pod("job-7-a2", "Worker", 0, node_name="n2",
                       reason="CreateContainerConfigError",
                       message='secret "job-7-a2-token" not found'),
    ]
    status = attempt_status(job, pods, PLACES, own_secret="job-7-a2-token")
    assert status.user_errors == ()
    assert [(w.reason, w.node_rank) for w in status.waits] == [
        ("ErrImagePull", 0), ("CreateContainerConfigError", 1)]


def hold_gpus(world, node, name):
    """Another tenant's pod takes every GPU of `node`: Regatta's rows do not
    know, the scheduler does."""
    world.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{
            "name": "c", "image": "registry.example/other:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})


@pytest.fixture
def other_tenant(kube_world):
    """Names of the other tenant's pods in `default`, deleted after the test."""
    made = []
    yield made
    for name in made:
        try:
            kube_world.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise


def scheduler_message(pod):
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "False":
            return cond.get("message")
    return None


@pytest.mark.slow
def test_an_unschedulable_pod_waits_with_the_schedulers_message(kube_world, regatta,
                                                                 other_tenant):
    pool = kube_world.make_pool(size=2)
    other_tenant.append(f"someone-elses-{pool.name}")
    hold_gpus(kube_world, pool.node_name(1), other_tenant[-1])
    info = make_pool(name=pool.name, node_selector=pool.selector)
    ref = regatta.launch(make_request(nodes=(pool.node_name(0), pool.node_name(1)), pool=info))

    seen = []

    def stuck():
        # What the job's pass reads, each time anew: on a loaded machine the
        # operator and kwok may still be writing the master's status when
        # the scheduler has given up on the worker.
        job, pods = as_served(kube_world, "job-7-a2")
        held = [p for p in pods if scheduler_message(p)]
        status = attempt_status(job, pods, ref["placements"])
        seen[:] = [status]
        return (held, status) if held and status.waits else None

    # The master runs on the free node; the worker waits.
    try:
        (pod,), status = eventually(stuck, timeout=60, interval=0.2,
                                    what="the scheduler to give up on the worker")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the attempt's status last read: {seen}") from None
    message = scheduler_message(pod)
    assert "Insufficient nvidia.com/gpu" in message
    (wait,) = status.waits
    assert (wait.reason, wait.message, wait.node_rank) == ("Unschedulable", message, 1)
    assert all(n.running for n in status.nodes)


def test_a_pulling_or_creating_pod_is_no_issue(standin):
    job = created(standin)
    pods = [st.waiting_pod("job-7-a2", "Master", 0, node_name="n1",
                           reason="ContainerCreating", message="")]
    assert attempt_status(job, pods, PLACES).start_issues == ()


@pytest.mark.slow
def test_a_finished_attempt_carries_no_start_issues(kube_world, regatta, other_tenant):
    """The master exits 1 while the worker is still unschedulable: the
    operator marks the job Failed, and its waits no longer count."""
    pool = kube_world.make_pool(size=2)
    other_tenant.append(f"someone-elses-{pool.name}")
    hold_gpus(kube_world, pool.node_name(1), other_tenant[-1])
    info = make_pool(name=pool.name, node_selector=pool.selector)
    ref = regatta.launch(make_request(nodes=(pool.node_name(0), pool.node_name(1)), pool=info))
    master = eventually(lambda: next((p for p in kube_world.pods(
        "training.kubeflow.org/job-name=job-7-a2,training.kubeflow.org/replica-type=master")
        if p.status.phase == "Running"), None), timeout=60, interval=0.2,
        what="the master to run")
    kube_world.fleet.fail_pod(NS, master.metadata.name, exit_code=1)
    eventually(lambda: condition_true(kube_world.pytorchjob("job-7-a2"), "Failed"),
               timeout=30, interval=0.2, what="the operator to mark the job Failed")
    job, pods = as_served(kube_world, "job-7-a2")
    assert any(scheduler_message(p) for p in pods)  # the worker still waits
    status = attempt_status(job, pods, ref["placements"])
    assert status.state == "failed" and status.start_issues == ()


# --- the provider reads the queue's objects --------------------------------------

def test_a_volcano_podgroup_that_cannot_be_placed_waits_with_volcanos_message(standin):
    provider = KubernetesProvider(standin.api_client(), KubeSettings(
        gang_scheduler="volcano", queue="training", request_timeout_s=5))
    ref = provider.launch(make_request())
    assert provider.observe(ref).start_issues == ()  # no PodGroup yet: nothing to say

    standin.put(st.volcano_podgroups(NS), st.podgroup(standin.get(JOBS, "job-7-a2"),
                                                      message=GANG))
    (wait,) = provider.observe(ref).waits
    assert (wait.reason, wait.message) == ("PodGroupPending", GANG)


# --- the job reconciler: an event within one observe interval ---------------------

@pytest.fixture
def fsx(tmp_path):
    return tmp_path


def kube_job(standin, fsx, **cluster_settings):
    """A launched two-node job, checkpoints on a shared volume (FSx through a
    PVC, mounted at the same path here)."""
    cluster = Cluster.objects.create(
        name="eks-a", provider=Cluster.Provider.KUBERNETES,
        settings={"api_url": standin.url, "namespace": NS, "request_timeout_s": 5,
                  "preflight": False, "checkpoint_pvc": "fsx",
                  "checkpoint_mount_path": str(fsx), **cluster_settings})
    NodePool.objects.create(cluster=cluster, name="h100", instance_type="p5.48xlarge",
                            gpus_per_node=8, size=2, spare_count=0, node_selector=GROUP,
                            settings={"node_autoscaler": "karpenter"})
    for name in ("n1", "n2"):
        standin.put(st.NODES, st.node(name, labels=GROUP, instance=f"i-0{name}"))
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, image="registry.example/nope:1.0",
                 storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    attempt = job.attempts.get()
    return job, attempt, attempt.provider_ref["name"], later(now, 1)


def real_kube_job(world, fsx, image, pool=None):
    """A launched two-node job on a kwok pool of its own (a Karpenter pool:
    placed by its labels), checkpoints on the cluster's shared volume."""
    pool = pool or world.make_pool(size=2)
    cluster = karpenter_cluster(world, pool, size=2, fsx=fsx, node_selector=pool.selector)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    team = team_with_quota(cluster, gpus=16)
    job = submit(cluster, team, nodes=2, gpus=8, image=image, storage_uri=str(fsx / "train"))
    launch(job, later(now, 1))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING, job.last_error
    attempt = job.attempts.get()
    return pool, job, attempt, attempt.provider_ref["name"], later(now, 1)


@pytest.mark.slow
def test_an_image_that_does_not_exist_fails_the_job_on_the_first_look(db, kube_world, fsx,
                                                                       monkeypatch):
    calls = record_every_provider(monkeypatch)
    pool, job, attempt, name, now = real_kube_job(kube_world, fsx, MISSING_IMAGE)
    eventually(lambda: waiting(kube_world, name, 2, "ErrImagePull"), timeout=60,
               interval=0.2, what="kwok's kubelet to fail the image pulls")

    reconcile_job_unlocked(job.id, later(now, job.cluster.config.observe_interval_s))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert attempt.failure_class == "code"
    assert "ErrImagePull" in attempt.failure_reason and "not found" in attempt.failure_reason
    assert "ErrImagePull" in job.last_error
    assert len(calls.calls("POST", JOBS)) == 1  # never relaunched
    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="its PyTorchJob to go")


def test_a_missing_secret_fails_the_job_with_its_name(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx)
    standin.put(PODS, st.waiting_pod(name, "Master", 0, node_name="n1",
                                     reason="CreateContainerConfigError",
                                     message='secret "hf-token" not found'))

    def failed():
        # The pod reaches the pass through the pod informer's watch.
        reconcile_job_unlocked(job.id, later(now, 5))
        job.refresh_from_db()
        return job.phase == Phase.FAILED

    eventually(failed, timeout=10, interval=0.1, what="the pass to see the pod")
    assert 'secret "hf-token" not found' in job.last_error


@pytest.mark.slow
def test_an_unschedulable_gang_waits_with_its_reason_and_never_hangs(db, kube_world, fsx,
                                                                    monkeypatch, other_tenant):
    calls = record_every_provider(monkeypatch)
    pool = kube_world.make_pool(size=2)
    for i in range(2):  # every node's GPUs held by another tenant
        other_tenant.append(f"someone-elses-{pool.name}-{i}")
        hold_gpus(kube_world, pool.node_name(i), other_tenant[-1])
    _, job, attempt, name, now = real_kube_job(kube_world, fsx, "registry.example/trainer:2.1",
                                               pool=pool)

    def both_stuck():
        _, pods = as_served(kube_world, name)
        messages = {scheduler_message(p) for p in pods}
        return messages if len(pods) == 2 and None not in messages else None

    messages = eventually(both_stuck, timeout=60, interval=0.2,
                          what="the scheduler to give up on both pods")
    assert all("Insufficient nvidia.com/gpu" in m for m in messages)
    config = job.cluster.config

    result = reconcile_job_unlocked(job.id, later(now, config.observe_interval_s))

    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    assert "Unschedulable" in job.pending_reason
    assert any(m in job.pending_reason for m in messages)
    (event,) = job.events.filter(kind="WaitingToStart")
    assert event.evidence["issues"][0]["message"] in messages
    assert result.requeue_after == config.observe_interval_s

    # Far past every start-up deadline: still a wait, one event, no relaunch.
    deadline = config.first_heartbeat_deadline_s
    for step in (deadline / 2, deadline * 2, deadline * 4):
        reconcile_job_unlocked(job.id, later(now, step))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.STARTING and attempt.state == JobAttempt.State.STARTING
    assert job.events.filter(kind="WaitingToStart").count() == 1
    assert len(calls.calls("POST", JOBS)) == 1

    # Capacity came: the other tenant leaves, the scheduler places the gang,
    # kwok runs it. The reason goes, and the start-up deadline counts from now.
    for other in other_tenant:
        kube_world.core.delete_namespaced_pod(other, "default", grace_period_seconds=0)
    eventually(lambda: pods_by_node(kube_world, name, 2), timeout=60, interval=0.2,
               what="the gang to be placed and run")
    eventually(lambda: condition_true(kube_world.pytorchjob(name), "Running"), timeout=30,
               interval=0.2, what="the PyTorchJob's Running condition")
    reconcile_job_unlocked(job.id, later(now, deadline * 4 + 5))
    job.refresh_from_db()
    assert job.pending_reason == "" and job.phase == Phase.STARTING
    reconcile_job_unlocked(job.id, later(now, deadline * 5 + 10))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"  # now the silence is a hang


def test_a_volcano_gang_that_cannot_be_placed_waits_with_volcanos_message(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx, gang_scheduler="volcano", queue="training")
    standin.put(st.volcano_podgroups(NS), st.podgroup(standin.get(JOBS, name), message=GANG))
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING and GANG in job.pending_reason
    assert job.events.filter(kind="WaitingToStart").count() == 1
