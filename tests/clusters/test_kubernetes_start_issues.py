"""What holds a gang back before any process runs, read from the pods, the
PyTorchJob, Kueue's Workload and Volcano's PodGroup.

Fakes only for Kubernetes: no API server, Kueue or Volcano can run here, so
tests/support/k8s_standin.py serves the shapes the kubelet, the scheduler,
Kueue and Volcano write, over real HTTP on 127.0.0.1 through the official
client; the reconcilers run for real against PostgreSQL.
"""

import pytest
from django.utils import timezone

from clusters.models import Cluster, NodePool
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes.observe import attempt_status
from clusters.reconcile import reconcile_cluster_unlocked
from jobs.models import JobAttempt, Phase
from jobs.reconcile import reconcile_job_unlocked
from tests.clusters.test_kubernetes_manifests import make_request
from tests.fleet_helpers import later, launch, submit, team_with_quota
from tests.support import k8s_standin as st

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
NO_QUOTA = ("couldn't assign flavors to pod set master: insufficient unused quota for "
            "nvidia.com/gpu in flavor h100, 8 more needed")
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

@pytest.mark.parametrize("reason,message", [
    ("ImagePullBackOff", 'Back-off pulling image "registry.example/nope:1.0"'),
    ("ErrImagePull", PULL_NOT_FOUND),
    ("CreateContainerConfigError", 'secret "hf-token" not found'),
])
def test_an_image_or_config_the_job_names_and_lacks_is_the_users_error(standin, reason, message):
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


def test_an_unschedulable_pod_waits_with_the_schedulers_message(standin):
    job = created(standin)
    pods = [st.unschedulable_pod("job-7-a2", "Worker", 0, message=NO_GPUS)]
    status = attempt_status(job, pods, PLACES)
    (wait,) = status.waits
    assert (wait.reason, wait.message, wait.node_rank) == ("Unschedulable", NO_GPUS, 1)
    assert all(n.running for n in status.nodes)


def test_a_pulling_or_creating_pod_is_no_issue(standin):
    job = created(standin)
    pods = [st.waiting_pod("job-7-a2", "Master", 0, node_name="n1",
                           reason="ContainerCreating", message="")]
    assert attempt_status(job, pods, PLACES).start_issues == ()


def test_a_finished_attempt_carries_no_start_issues(standin):
    job = created(standin)
    job["status"]["conditions"].append(st.job_condition("Failed"))
    pods = [st.unschedulable_pod("job-7-a2", "Worker", 0, message=NO_GPUS)]
    status = attempt_status(job, pods, PLACES)
    assert status.state == "failed" and status.start_issues == ()


# --- the provider reads the queue's objects --------------------------------------

def test_a_kueue_suspended_job_waits_with_its_workloads_message(standin):
    st.kueue_holds(standin, NO_QUOTA)
    provider = KubernetesProvider(standin.api_client(), KubeSettings(
        gang_scheduler="kueue", queue="team-a", request_timeout_s=5))
    ref = provider.launch(make_request())

    status = provider.observe(ref)

    (wait,) = status.waits
    assert (wait.reason, wait.message, wait.node_rank) == ("KueuePending", NO_QUOTA, None)
    assert status.state == "running" and status.user_errors == ()
    uid = standin.get(JOBS, "job-7-a2")["metadata"]["uid"]
    (listed,) = standin.calls("GET", st.kueue_workloads(NS))
    assert listed.query["labelSelector"] == f"kueue.x-k8s.io/job-uid={uid}"


def test_an_admitted_workload_and_a_started_job_need_no_look_at_the_queue(standin):
    provider = KubernetesProvider(standin.api_client(), KubeSettings(
        gang_scheduler="kueue", queue="team-a", request_timeout_s=5))
    ref = provider.launch(make_request())
    job = standin.get(JOBS, "job-7-a2")
    standin.put(st.kueue_workloads(NS), st.workload(job, admitted=True))
    assert provider.observe(ref).start_issues == ()
    job["status"] = {"conditions": [st.job_condition("Running")]}
    before = len(standin.calls("GET", st.kueue_workloads(NS)))
    assert provider.observe(ref).start_issues == ()
    assert len(standin.calls("GET", st.kueue_workloads(NS))) == before


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


def test_an_image_that_does_not_exist_fails_the_job_on_the_first_look(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx)
    standin.put(PODS, st.waiting_pod(name, "Master", 0, node_name="n1",
                                     reason="ErrImagePull", message=PULL_NOT_FOUND))
    standin.put(PODS, st.waiting_pod(name, "Worker", 0, node_name="n2",
                                     reason="ImagePullBackOff",
                                     message='Back-off pulling image "registry.example/nope:1.0"'))

    reconcile_job_unlocked(job.id, later(now, job.cluster.config.observe_interval_s))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert attempt.failure_class == "code"
    assert "ErrImagePull" in attempt.failure_reason and "not found" in attempt.failure_reason
    assert "ErrImagePull" in job.last_error
    assert len(standin.calls("POST", JOBS)) == 1  # never relaunched
    assert standin.get(JOBS, name) is None  # its PyTorchJob is gone


def test_a_missing_secret_fails_the_job_with_its_name(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx)
    standin.put(PODS, st.waiting_pod(name, "Master", 0, node_name="n1",
                                     reason="CreateContainerConfigError",
                                     message='secret "hf-token" not found'))
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.FAILED and 'secret "hf-token" not found' in job.last_error


def test_an_unschedulable_gang_waits_with_its_reason_and_never_hangs(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx)
    standin.put(PODS, st.unschedulable_pod(name, "Master", 0, message=NO_GPUS))
    standin.put(PODS, st.unschedulable_pod(name, "Worker", 0, message=NO_GPUS))
    config = job.cluster.config

    result = reconcile_job_unlocked(job.id, later(now, config.observe_interval_s))

    job.refresh_from_db()
    assert job.phase == Phase.STARTING
    assert NO_GPUS in job.pending_reason and "Unschedulable" in job.pending_reason
    (event,) = job.events.filter(kind="WaitingToStart")
    assert event.evidence["issues"][0]["message"] == NO_GPUS
    assert result.requeue_after == config.observe_interval_s

    # Far past every start-up deadline: still a wait, one event, no relaunch.
    deadline = config.first_heartbeat_deadline_s
    for step in (deadline / 2, deadline * 2, deadline * 4):
        reconcile_job_unlocked(job.id, later(now, step))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.STARTING and attempt.state == JobAttempt.State.STARTING
    assert job.events.filter(kind="WaitingToStart").count() == 1
    assert len(standin.calls("POST", JOBS)) == 1

    # Capacity came: the reason goes, and the start-up deadline counts from now.
    standin.get(JOBS, name)["status"] = {"conditions": [st.job_condition("Running")]}
    standin.put(PODS, st.pod(name, "Master", 0, node_name="n1"))
    standin.put(PODS, st.pod(name, "Worker", 0, node_name="n2"))
    reconcile_job_unlocked(job.id, later(now, deadline * 4 + 5))
    job.refresh_from_db()
    assert job.pending_reason == "" and job.phase == Phase.STARTING
    reconcile_job_unlocked(job.id, later(now, deadline * 5 + 10))
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert attempt.failure_class == "hang"  # now the silence is a hang


def test_a_kueue_held_job_waits_with_kueues_message(db, standin, fsx):
    st.kueue_holds(standin, NO_QUOTA)
    job, attempt, name, now = kube_job(standin, fsx, gang_scheduler="kueue", queue="team-a")
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING and NO_QUOTA in job.pending_reason
    (event,) = job.events.filter(kind="WaitingToStart")
    assert event.evidence["issues"] == [{"reason": "KueuePending", "message": NO_QUOTA,
                                         "node_rank": None}]


def test_a_volcano_gang_that_cannot_be_placed_waits_with_volcanos_message(db, standin, fsx):
    job, attempt, name, now = kube_job(standin, fsx, gang_scheduler="volcano", queue="training")
    standin.put(st.volcano_podgroups(NS), st.podgroup(standin.get(JOBS, name), message=GANG))
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING and GANG in job.pending_reason
    assert job.events.filter(kind="WaitingToStart").count() == 1
