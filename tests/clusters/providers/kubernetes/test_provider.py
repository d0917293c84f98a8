"""The Kubernetes provider against a real API server.

tests/support/kube_cluster.py runs etcd, kube-apiserver, the scheduler, the
controller-manager, kwok and the training operator; the provider acts with
deploy/'s ServiceAccount token, so RBAC is the real Role's. Each test makes
its own kwok pool. A Recorder (tests/support/kube_calls.py) notes what the
provider sent on its way to the server. What the cluster cannot do, the
test does, and only that: it plays the containers' exits (kwok stages,
testcluster/fleet.py), the kubelet's and DCGM's status writes, and a
container's output (tests/support/pod_logs.py, since no container runs).
"""

import base64
import json
import socket

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from clusters.models import Cluster, NodePool
from clusters.providers.base import Placement
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes.errors import DEFAULT_DELAY_S
from clusters.providers.kubernetes.informers import ClusterCache
from clusters.providers.kubernetes.kinds import PYTORCHJOB
from clusters.providers.kubernetes.observe import CORDONED_BY_REGATTA
from clusters.providers.kubernetes.preflight import LABEL_CHECKS, checks_label
from clusters.providers.kubernetes.reachability import request_timeout
from clusters.providers.kubernetes.resources import smallest_allocatable
from clusters.providers.registry import get_provider, pool_info
from controlplane.lib.errors import PermanentError, TemporaryError
from testcluster import bootstrap
from testcluster.fleet import SPOT_ITN_TAINT
from tests.support import k8s_standin as st
from tests.support.kube_calls import Recorder
from tests.support.kube_cluster import TRAINING_NS, seen_by_informers
from tests.support.pod_logs import PodLogs
from tests.support.waiting import eventually

from .test_manifests import TOKEN, make_pool, make_request
from .test_real_cluster import OPERATOR_JOB_LABEL, condition_true

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NS = TRAINING_NS
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
PODS = f"/api/v1/namespaces/{NS}/pods"
NODES = "/api/v1/nodes"


@pytest.fixture
def calls(kube_world):
    return Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))


def provider_for(calls, **settings):
    return KubernetesProvider(calls.api, KubeSettings.parse({"request_timeout_s": 10, **settings}),
                              sleep=lambda s: None)


@pytest.fixture
def provider(calls):
    return provider_for(calls)


def kwok_pool(world, size=3, settings=None, **kw):
    """A pool of kwok nodes, and the PoolInfo Regatta has of it."""
    pool = world.make_pool(size=size, **kw)
    return pool, make_pool(name=pool.name, node_selector=pool.selector, settings=settings)


def request_on(pool, info, count=None, **kw):
    nodes = tuple(pool.node_name(i) for i in range(pool.size if count is None else count))
    return make_request(nodes=nodes, pool=info, **kw)


def node_json(world, name):
    resp = world.core.read_node(name, _preload_content=False)
    return json.loads(resp.data)


def pods_by_node(world, name, count, phase="Running"):
    """The job's pods by node once there are `count` of them in `phase`."""
    pods = world.pods(f"{OPERATOR_JOB_LABEL}={name}")
    if len(pods) == count and all(p.status.phase == phase for p in pods):
        return {p.spec.node_name: p for p in pods}
    return None


def launch_running(world, provider, request):
    """Launched, its pods Running on their nodes and the operator's Running
    condition set."""
    ref = provider.launch(request)
    pods = eventually(lambda: pods_by_node(world, request.name, len(request.placements)),
                      timeout=60, interval=0.2, what="the operator's pods to run")
    eventually(lambda: condition_true(world.pytorchjob(request.name), "Running"), timeout=30,
               interval=0.2, what="the PyTorchJob's Running condition")
    return ref, pods


def ranks(pods):
    """The pods by node rank, as torchrun numbers them: Master 0, Worker i
    i + 1. The operator gives Worker indexes to the pinned nodes in any
    order, so a rank need not run on the placement of the same rank."""
    out = {}
    for pod in pods.values():
        labels = pod.metadata.labels
        index = int(labels["training.kubeflow.org/replica-index"])
        out[0 if labels["training.kubeflow.org/replica-type"] == "master" else index + 1] = pod
    return out


def as_kubelet(world, pod, patch):
    """Write a pod's status as its kubelet would (a JSON patch), and wait
    for the pod informers to see it."""
    seen_by_informers(world, "pods", world.core.patch_namespaced_pod_status(pod, NS, patch))


def other_identity(world, name, rules=()):
    """An ApiClient with the token of a ServiceAccount `name` in the training
    namespace, holding only `rules` there."""
    core, rbac = world.core, k8s.RbacAuthorizationV1Api(world.admin)
    core.create_namespaced_service_account(NS, {"metadata": {"name": name}})
    if rules:
        rbac.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": list(rules)})
        rbac.create_namespaced_role_binding(NS, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]})
    token = core.create_namespaced_service_account_token(
        name, NS, {"spec": {"expirationSeconds": 600}}).status.token
    return token_client(world, token)


def token_client(world, token):
    base = bootstrap.api_client(world.regatta_kubeconfig).configuration
    cfg = k8s.Configuration()
    cfg.host, cfg.ssl_ca_cert = base.host, base.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(cfg)


@pytest.fixture
def cleanup_identities(kube_world):
    """ServiceAccounts, Roles and RoleBindings a test made, removed after it."""
    made = []
    yield made
    rbac = k8s.RbacAuthorizationV1Api(kube_world.admin)
    for name in made:
        for delete in (kube_world.core.delete_namespaced_service_account,
                       rbac.delete_namespaced_role, rbac.delete_namespaced_role_binding):
            try:
                delete(name, NS)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def contains(stored, sent) -> bool:
    """Whether `stored` holds every field of `sent` with its value."""
    if isinstance(sent, dict):
        return isinstance(stored, dict) and all(
            k in stored and contains(stored[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return (isinstance(stored, list) and len(stored) == len(sent)
                and all(contains(a, b) for a, b in zip(stored, sent, strict=True)))
    return stored == sent


# --- launch ------------------------------------------------------------------

def test_it_launches_the_job_then_its_token_secret_owned_by_it(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world)
    request = request_on(pool, info)
    ref = provider.launch(request)

    posts = calls.calls("POST")
    assert [c.path for c in posts] == [JOBS, SECRETS]
    sent = posts[0].body
    placed = [node_json(kube_world, n) for n in (p.node for p in request.placements)]
    assert sent == mf.to_dict(mf.pytorch_job(request, provider.settings,
                                             smallest_allocatable(placed)))
    assert mf.from_dict(sent, "KubeflowOrgV1PyTorchJob").spec.nproc_per_node == "8"
    assert posts[1].body["stringData"] == {"token": TOKEN}
    assert TOKEN not in repr(sent)
    # Only the verbs deploy/ grants: nothing is patched.
    assert calls.calls("PATCH") == []

    job = kube_world.pytorchjob("job-7-a2")
    # The API server kept every field it was sent: its schema prunes none
    # (the operator adds its defaults, such as runPolicy.suspend).
    assert contains(job["spec"], sent["spec"])
    secret = kube_world.core.read_namespaced_secret("job-7-a2-token", NS)
    assert base64.b64decode(secret.data["token"]).decode() == TOKEN
    (owner,) = secret.metadata.owner_references
    assert owner.kind == "PyTorchJob" and owner.uid == job["metadata"]["uid"]
    assert ref == {
        "provider": "kubernetes", "namespace": NS, "name": "job-7-a2",
        "uid": job["metadata"]["uid"], "secret": "job-7-a2-token",
        "placements": [{"node": pool.node_name(i), "node_rank": i} for i in range(3)],
    }


def test_launching_twice_is_one_job(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=1)
    request = request_on(pool, info)
    first = provider.launch(request)
    again = provider.launch(request)
    assert again["uid"] == first["uid"]
    assert len(kube_world.custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs")["items"]) == 1
    secrets = kube_world.core.list_namespaced_secret(NS, label_selector="regatta.io/attempt-id")
    assert [s.metadata.name for s in secrets.items] == ["job-7-a2-token"]
    assert [c.path for c in calls.calls("POST")] == [JOBS, SECRETS, JOBS, SECRETS, SECRETS]
    # The relaunch replaced the secret rather than trusting a stale token.
    assert [c.path for c in calls.calls("DELETE")] == [f"{SECRETS}/job-7-a2-token"]
    (owner,) = secrets.items[0].metadata.owner_references
    assert owner.uid == first["uid"]


def test_a_name_taken_by_another_attempt_is_a_permanent_error(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=1)
    theirs = request_on(pool, info, attempt_id=99)
    kube_world.custom.create_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs", mf.to_dict(mf.pytorch_job(theirs,
                                                                           provider.settings)))
    with pytest.raises(PermanentError, match="not this attempt's"):
        provider.launch(request_on(pool, info))
    job = kube_world.pytorchjob("job-7-a2")
    assert job["metadata"]["labels"]["regatta.io/attempt-id"] == "99"


def test_a_secret_of_another_attempt_is_left_alone(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=1)
    kube_world.core.create_namespaced_secret(NS, {"metadata": {
        "name": "job-7-a2-token", "labels": {"regatta.io/attempt-id": "5"}},
        "stringData": {"token": "theirs"}})
    with pytest.raises(PermanentError, match="not this attempt's"):
        provider.launch(request_on(pool, info))
    assert calls.calls("DELETE") == []
    secret = kube_world.core.read_namespaced_secret("job-7-a2-token", NS)
    assert secret.metadata.labels["regatta.io/attempt-id"] == "5"


def test_a_rejected_job_is_a_permanent_error(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=1)
    # Object names are DNS labels: the API server's validation refuses this one.
    with pytest.raises(PermanentError, match="422"):
        provider.launch(request_on(pool, info, name="Job_7_A2"))
    assert kube_world.custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs")["items"] == []


def test_forbidden_is_permanent(kube_world, cleanup_identities):
    """A token whose account may read nodes' pods but not change nodes."""
    pool, info = kwok_pool(kube_world, size=1)
    cleanup_identities.append("regatta-readonly")
    api = other_identity(kube_world, "regatta-readonly",
                         rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])
    provider = KubernetesProvider(api, KubeSettings(request_timeout_s=10))
    with pytest.raises(PermanentError, match="403"):
        provider.cordon(info, pool.node_name(0))
    assert not kube_world.core.read_node(pool.node_name(0)).spec.unschedulable


def test_an_expired_credential_is_neither_and_raised_as_is(kube_world):
    pool, info = kwok_pool(kube_world, size=1)
    provider = KubernetesProvider(token_client(kube_world, "an-expired-token"),
                                  KubeSettings(request_timeout_s=10))
    with pytest.raises(ApiException) as caught:
        provider.list_nodes(info)
    assert caught.value.status == 401


def test_an_unreachable_api_server_is_temporary():
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = KubeSettings(api_url=url, request_timeout_s=2)
    provider = KubernetesProvider.for_cluster("gone", settings)
    provider.core.api_client.configuration.retries = 0
    with pytest.raises(TemporaryError):
        provider.list_nodes(make_pool())


def test_a_webhook_that_cannot_be_called_is_a_temporary_server_error(kube_world, calls,
                                                                     provider):
    """500: an admission webhook with failurePolicy Fail whose server is
    away (here: a port nothing listens on) fails the cordon."""
    pool, info = kwok_pool(kube_world, size=1)
    node = pool.node_name(0)
    kube_world.core.patch_node(node, {"metadata": {"labels": {"regatta.test/webhook": "away"}}})
    hooks = k8s.AdmissionregistrationV1Api(kube_world.admin)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"https://127.0.0.1:{sock.getsockname()[1]}/validate"
    hooks.create_validating_webhook_configuration({
        "metadata": {"name": "regatta-test-away"},
        "webhooks": [{"name": "away.regatta.test", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 2,
                      "clientConfig": {"url": url},
                      "objectSelector": {"matchLabels": {"regatta.test/webhook": "away"}},
                      "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                 "operations": ["UPDATE"], "resources": ["nodes"]}]}]})
    try:
        eventually(lambda: answers(500, lambda: kube_world.core.patch_node(
                       node, {"spec": {"unschedulable": True}}, dry_run="All")),
                   timeout=30, interval=0.2, what="the API server to call the webhook")
        with pytest.raises(TemporaryError, match="500"):
            provider.cordon(info, node)
        assert calls.calls("PATCH")[-1].status == 500
    finally:
        hooks.delete_validating_webhook_configuration("regatta-test-away")


def answers(status: int, call) -> bool:
    """Whether `call` fails with HTTP `status` now: an error a test set up
    on the API server, which it serves only once it has taken effect."""
    try:
        call()
    except ApiException as exc:
        return exc.status == status
    return False


def test_an_api_group_whose_server_is_away_is_a_temporary_server_error(kube_world, calls):
    """503: the API server proxies an aggregated group to a Service with no
    server behind it (Volcano's group here, served that way for the test)."""
    pool, info = kwok_pool(kube_world, size=1)
    provider = provider_for(calls, gang_scheduler="volcano", queue="training")
    ref = provider.launch(request_on(pool, info))
    registration = k8s.ApiregistrationV1Api(kube_world.admin)
    registration.create_api_service({
        "metadata": {"name": "v1beta1.scheduling.volcano.sh"},
        "spec": {"group": "scheduling.volcano.sh", "version": "v1beta1",
                 "groupPriorityMinimum": 1000, "versionPriority": 15,
                 "insecureSkipTLSVerify": True,
                 "service": {"namespace": "default", "name": "volcano-away", "port": 443}}})
    try:
        eventually(lambda: answers(503, lambda: kube_world.custom.get_namespaced_custom_object(
                       "scheduling.volcano.sh", "v1beta1", NS, "podgroups", "job-7-a2")),
                   timeout=30, interval=0.2, what="the aggregator to find the group's server away")
        with pytest.raises(TemporaryError, match="503"):
            provider.observe(ref)  # a gang not started reads its PodGroup
        assert calls.calls("GET", "/apis/scheduling.volcano.sh/")[-1].status == 503
    finally:
        registration.delete_api_service("v1beta1.scheduling.volcano.sh")


# --- observe -----------------------------------------------------------------

def test_it_observes_a_running_attempt(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    by_rank = ranks(pods)
    # The kubelet restarted rank 2's container once.
    as_kubelet(kube_world, by_rank[2].metadata.name, [
        {"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 1}])
    status = provider.observe(ref)
    assert status.state == "running"
    assert [(n.node, n.node_rank, n.running) for n in status.nodes] == [
        (by_rank[i].spec.node_name, i, True) for i in range(3)]
    assert {n.node for n in status.nodes} == {pool.node_name(i) for i in range(3)}
    assert status.failed_nodes == ()
    assert "rank 2 restarted 1x" in status.message
    pods_query = calls.calls("GET", PODS)[-1].query
    assert pods_query["labelSelector"] == "training.kubeflow.org/job-name=job-7-a2"


def test_a_rank_that_exited_is_a_failed_node_with_its_code_and_log(kube_world, provider):
    pool, info = kwok_pool(kube_world)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    one, two = ranks(pods)[1].metadata.name, ranks(pods)[2].metadata.name
    logs = PodLogs().install(provider)
    # The container's terminationMessagePolicy is FallbackToLogsOnError: on a
    # failed exit the kubelet writes the log's tail as the termination
    # message, so the tail comes with the pod and no log is read.
    kube_world.fleet.fail_pod(NS, one, exit_code=84, message="RuntimeError: NCCL timeout\n")
    kube_world.fleet.fail_pod(NS, two, exit_code=137, reason="OOMKilled", message="Killed")
    eventually(lambda: all(kube_world.core.read_namespaced_pod(p, NS).status.phase == "Failed"
                           for p in (one, two)),
               timeout=30, interval=0.2, what="kwok to fail both containers")
    status = provider.observe(ref)
    assert status.state == "failed"
    by_rank = {n.node_rank: n for n in status.failed_nodes}
    assert set(by_rank) == {1, 2}
    assert by_rank[1].node == ranks(pods)[1].spec.node_name
    assert by_rank[1].exit_code == 84 and by_rank[1].signal is None
    assert by_rank[1].log_tail == "RuntimeError: NCCL timeout\n"
    assert by_rank[2].signal == 9 and by_rank[2].log_tail == "Killed"
    assert logs.reads == []


def test_a_rank_that_exited_without_a_message_has_its_log_read(kube_world, provider):
    """A terminated container whose message is empty (it printed nothing the
    kubelet kept, or the policy is File): the log is read, from `pytorch`."""
    pool, info = kwok_pool(kube_world, size=1)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    pod = pods[pool.node_name(0)].metadata.name
    logs = PodLogs({(NS, pod): "RuntimeError: NCCL timeout\n"}).install(provider)
    kube_world.fleet.fail_pod(NS, pod, exit_code=84)
    eventually(lambda: kube_world.core.read_namespaced_pod(pod, NS).status.phase == "Failed",
               timeout=30, interval=0.2, what="kwok to fail the container")
    # kwok writes a message of its own ("container failed"); a kubelet
    # writes none when there is nothing to fall back to.
    as_kubelet(kube_world, pod, [{"op": "remove", "path":
                                  "/status/containerStatuses/0/state/terminated/message"}])
    (failed,) = provider.observe(ref).failed_nodes
    assert failed.exit_code == 84 and failed.log_tail == "RuntimeError: NCCL timeout\n"
    assert logs.reads[-1]["pod"] == pod and logs.reads[-1]["container"] == "pytorch"


def test_an_evicted_pod_counts_as_killed(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=1)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    # The kubelet evicted it for memory pressure before its container reported.
    as_kubelet(kube_world, pods[pool.node_name(0)].metadata.name, [
        {"op": "replace", "path": "/status/phase", "value": "Failed"},
        {"op": "add", "path": "/status/reason", "value": "Evicted"},
        {"op": "add", "path": "/status/message", "value": "The node was low on memory."},
        {"op": "remove", "path": "/status/containerStatuses"}])
    (failed,) = provider.observe(ref).failed_nodes
    assert failed.signal == 9 and "Evicted" in failed.log_tail


def test_a_pod_gone_after_start_is_a_lost_rank(kube_world, calls):
    # With the informers, as for_cluster makes it: the pod watch saw the
    # rank's pod go. (Asked afresh, a missing pod and the operator's
    # FailedCreate for it look like a pod not made yet.)
    cache = ClusterCache(calls.api, NS, "app.kubernetes.io/managed-by=regatta",
                         request_timeout(10))
    provider = KubernetesProvider(calls.api, KubeSettings(request_timeout_s=10), cache=cache)
    try:
        lost_rank_when_its_pod_goes(kube_world, provider)
    finally:
        cache.stop()


def lost_rank_when_its_pod_goes(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=2)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    # The namespace's quota was cut to one pod: the operator cannot make the
    # rank again once it is gone.
    kube_world.core.create_namespaced_resource_quota(NS, {
        "metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    try:
        eventually(lambda: (kube_world.core.read_namespaced_resource_quota(
            "one-pod", NS).status.used or {}).get("pods") == "2", timeout=30, interval=0.2,
            what="the quota to count the pods")
        worker = ranks(pods)[1].metadata
        kube_world.core.delete_namespaced_pod(worker.name, NS)
        eventually(lambda: worker.uid not in {
            p.metadata.uid for p in kube_world.pods(f"{OPERATOR_JOB_LABEL}=job-7-a2")},
            timeout=30, interval=0.2, what="the pod to go")
        # Lost on the node it ran on, killed from outside (no sign from its
        # node: it is still there).
        (lost,) = eventually(lambda: provider.observe(ref).failed_nodes, timeout=10,
                             interval=0.2, what="the pod watch to see it go")
        where = ranks(pods)[1].spec.node_name
        assert (lost.node, lost.node_rank, lost.signal) == (where, 1, 9)
        assert not lost.node_lost and "deleted" in lost.log_tail
    finally:
        kube_world.core.delete_namespaced_resource_quota("one-pod", NS)


def test_pods_not_made_yet_are_starting_not_failed(kube_world, provider):
    pool, info = kwok_pool(kube_world)
    ref = provider.launch(request_on(pool, info))
    status = provider.observe(ref)
    assert status.state == "running" and status.failed_nodes == ()
    assert all(n.running for n in status.nodes)


def test_a_succeeded_job_is_succeeded(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=1)
    ref, pods = launch_running(kube_world, provider, request_on(pool, info))
    kube_world.fleet.succeed_pod(NS, pods[pool.node_name(0)].metadata.name)
    eventually(lambda: condition_true(kube_world.pytorchjob("job-7-a2"), "Succeeded"),
               timeout=30, interval=0.2, what="the operator to mark the job Succeeded")
    status = provider.observe(ref)
    assert status.state == "succeeded"
    assert status.nodes[0].exit_code == 0 and status.failed_nodes == ()


def test_a_vanished_job_is_unknown(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=1)
    ref = provider.launch(request_on(pool, info))
    kube_world.custom.delete_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs",
                                                      "job-7-a2")
    eventually(lambda: kube_world.pytorchjob("job-7-a2") is None, timeout=30, interval=0.2,
               what="the PyTorchJob to go")
    status = provider.observe(ref)
    assert status.state == "unknown" and "no longer exists" in status.message


# --- stop, cordon, drain, replace --------------------------------------------

def test_stop_deletes_the_job_with_foreground_propagation_and_its_secret(kube_world, calls,
                                                                         provider):
    pool, info = kwok_pool(kube_world, size=1)
    ref = provider.launch(request_on(pool, info))
    provider.stop(ref, grace_s=45)
    (delete,) = calls.calls("DELETE", JOBS)
    assert delete.body["propagationPolicy"] == "Foreground"
    assert delete.body["gracePeriodSeconds"] == 45
    eventually(lambda: kube_world.pytorchjob("job-7-a2") is None, timeout=60, interval=0.2,
               what="the PyTorchJob to go")
    assert kube_world.core.list_namespaced_secret(
        NS, label_selector="regatta.io/attempt-id").items == []
    provider.stop(ref)  # gone already: 404 is done
    assert len(calls.calls("DELETE", JOBS)) == 2


def test_stop_can_propagate_in_the_background(kube_world, calls):
    pool, info = kwok_pool(kube_world, size=1)
    provider = provider_for(calls, delete_propagation="Background")
    ref = provider.launch(request_on(pool, info))
    provider.stop(ref)
    assert calls.calls("DELETE", JOBS)[0].body["propagationPolicy"] == "Background"


def test_cordon_and_uncordon_patch_unschedulable(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=1)
    n1 = pool.node_name(0)
    provider.cordon(info, n1)
    assert kube_world.core.read_node(n1).spec.unschedulable is True
    provider.uncordon(info, n1)
    # The API server leaves a false `unschedulable` out of the Node.
    assert not kube_world.core.read_node(n1).spec.unschedulable
    bodies = [c.body for c in calls.calls("PATCH", f"{NODES}/{n1}")]
    # Regatta's own cordon is marked on the Node, so an admin's is told apart.
    assert bodies == [
        {"metadata": {"annotations": {CORDONED_BY_REGATTA: "true"}},
         "spec": {"unschedulable": True}},
        {"metadata": {"annotations": {CORDONED_BY_REGATTA: None}},
         "spec": {"unschedulable": False}}]
    provider.cordon(info, "gone")  # a node that is gone needs no cordon


def test_drain_cordons_then_evicts_regattas_pods_with_time_to_checkpoint(kube_world, calls,
                                                                        provider):
    pool, info = kwok_pool(kube_world, size=2)
    n1, n2 = pool.node_name(0), pool.node_name(1)
    # A finished job's pod on n1, which drain leaves alone.
    done_ref, done_pods = launch_running(kube_world, provider, make_request(
        nodes=(n1,), pool=info, name="job-5-a1", job_id=5, attempt_id=9))
    kube_world.fleet.succeed_pod(NS, done_pods[n1].metadata.name)
    eventually(lambda: pods_by_node(kube_world, "job-5-a1", 1, phase="Succeeded"),
               timeout=30, interval=0.2, what="job-5-a1's pod to finish")
    _, pods = launch_running(kube_world, provider, request_on(pool, info))
    evicted, kept = pods[n1].metadata, pods[n2].metadata
    provider.drain(info, n1, grace_s=60)

    assert kube_world.core.read_node(n1).spec.unschedulable is True
    listing = calls.calls("GET", PODS)[-1].query
    assert listing["fieldSelector"] == f"spec.nodeName={n1}"
    assert listing["labelSelector"] == "app.kubernetes.io/managed-by=regatta"
    (evict,) = calls.calls("POST", f"{PODS}/")
    assert evict.path == f"{PODS}/{evicted.name}/eviction"
    assert evict.body["kind"] == "Eviction"
    # At least the pods' own grace (120 s), so the emergency checkpoint fits.
    assert evict.body["deleteOptions"]["gracePeriodSeconds"] == 120
    uids = lambda: {p.metadata.uid for p in kube_world.core.list_namespaced_pod(NS).items}  # noqa: E731
    eventually(lambda: evicted.uid not in uids(), timeout=30, interval=0.2,
               what="the evicted pod to go")
    assert kept.uid in uids() and done_pods[n1].metadata.uid in uids()


def test_a_disruption_budget_refusal_is_retried_later(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=1)
    _, pods = launch_running(kube_world, provider, request_on(pool, info))
    policy = k8s.PolicyV1Api(kube_world.admin)
    policy.create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "keep-all"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {OPERATOR_JOB_LABEL: "job-7-a2"}}}})
    eventually(lambda: (policy.read_namespaced_pod_disruption_budget("keep-all", NS).status
                        or k8s.V1PodDisruptionBudgetStatus(
                            current_healthy=0, desired_healthy=0, disruptions_allowed=0,
                            expected_pods=0)).expected_pods == 1,
               timeout=30, interval=0.2, what="the disruption controller to count the pod")
    with pytest.raises(TemporaryError) as caught:
        provider.drain(info, pool.node_name(0))
    # A budget that allows no disruption now: the API server answers 429
    # without a Retry-After (it sends one only while the budget is still
    # being processed), so the provider's own delay applies.
    (refused,) = [c for c in calls.calls("POST", f"{PODS}/") if c.status == 429]
    assert "Retry-After" not in refused.headers
    assert caught.value.delay == DEFAULT_DELAY_S
    pod = pods[pool.node_name(0)].metadata
    assert kube_world.core.read_namespaced_pod(pod.name, NS).metadata.uid == pod.uid


def test_replace_on_a_karpenter_pool_deletes_the_node(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=1, settings={"node_autoscaler": "karpenter"})
    n1 = pool.node_name(0)
    assert provider.replace(info, n1) is None
    eventually(lambda: n1 not in {n.metadata.name for n in kube_world.core.list_node().items},
               timeout=30, interval=0.2, what="the Node to go")
    assert provider.replace(info, n1) is None  # 404: already done
    assert [c.path for c in calls.calls("DELETE")] == [f"{NODES}/{n1}"] * 2


def test_replace_on_a_pool_without_a_group_or_karpenter_is_refused(kube_world, calls, provider):
    """Deleting a managed node group's Node only makes its kubelet register
    the same instance again: nothing may be deleted."""
    pool, info = kwok_pool(kube_world, size=1)
    with pytest.raises(PermanentError, match="asg_name.*node_autoscaler"):
        provider.replace(info, pool.node_name(0))
    assert calls.calls("DELETE") == []
    assert kube_world.core.read_node(pool.node_name(0)) is not None


@pytest.mark.parametrize("settings, match", [
    ({"node_autoscaler": "cluster-autoscaler"}, "node_autoscaler"),
    ({"node_autoscaler": "karpenter", "asg_name": "g"}, "contradict"),
])
def test_a_bad_replacement_setting_is_refused_before_any_call(kube_world, calls, provider,
                                                              settings, match):
    pool = kube_world.make_pool(size=1)
    with pytest.raises(PermanentError, match=match):
        provider.replace(make_pool(name=pool.name, node_selector=pool.selector,
                                   settings=settings), pool.node_name(0))
    assert calls.calls("DELETE") == [] and calls.calls("GET") == []


def test_provisioning_without_an_auto_scaling_group_is_refused(provider):
    with pytest.raises(PermanentError, match="asg_name"):
        provider.provision_node(make_pool(), "spare-1")


# --- nodes and health ------------------------------------------------------------

def as_device_plugin(world, node, gpus):
    """The NVIDIA device plugin withdraws GPUs it saw raise a fatal XID."""
    seen_by_informers(world, "nodes", world.core.patch_node_status(
        node, {"status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}))


def as_monitoring_agent(world, node, status, reason, message=""):
    """EKS's node monitoring agent sets the DCGM condition."""
    condition = {"type": "AcceleratedHardwareReady", "status": status, "reason": reason,
                 "message": message, "lastHeartbeatTime": "2026-01-02T00:00:00Z",
                 "lastTransitionTime": "2026-01-02T00:00:00Z"}
    seen_by_informers(world, "nodes", world.core.patch_node_status(
        node, {"status": {"conditions": [condition]}}))


def not_ready(world, node):
    world.fleet.make_not_ready(node)
    eventually(lambda: not world.fleet.ready(node), timeout=30, interval=0.2,
               what=f"kwok to report {node} NotReady")


def test_it_lists_the_pools_nodes_with_gpus_and_conditions(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=2)
    kube_world.make_pool(size=1)  # another pool's node
    n1, n2 = pool.node_name(0), pool.node_name(1)
    not_ready(kube_world, n2)
    as_device_plugin(kube_world, n2, 7)
    kube_world.core.patch_node(n2, {"spec": {"unschedulable": True}})
    nodes = {n.name: n for n in provider.list_nodes(info)}
    assert set(nodes) == {n1, n2}
    assert calls.calls("GET", NODES)[-1].query["labelSelector"] == (
        f"eks.amazonaws.com/nodegroup={pool.name}")
    assert nodes[n1].gpus == 8 and nodes[n1].ready and not nodes[n1].unschedulable
    assert nodes[n1].provider_id == kube_world.core.read_node(n1).spec.provider_id
    assert nodes[n1].provider_id.startswith("aws:///us-east-1a/i-0")
    internal = [a.address for a in kube_world.core.read_node(n1).status.addresses
                if a.type == "InternalIP"]
    assert nodes[n1].address == internal[0] and internal[0].startswith("10.0.")
    assert nodes[n2].gpus == 7 and not nodes[n2].ready and nodes[n2].unschedulable
    assert nodes[n2].conditions["Ready"] == "False"


def test_it_turns_dcgm_conditions_xids_and_spot_taints_into_signals(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=6)
    healthy, xid, dbe, plugin, spot, down = (pool.node_name(i) for i in range(6))
    as_monitoring_agent(kube_world, healthy, "True", "Ok")
    as_monitoring_agent(kube_world, xid, "False", "NvidiaXID79Error",
                        "GPU has fallen off the bus")
    as_monitoring_agent(kube_world, dbe, "False", "NvidiaDoubleBitEccError")
    as_device_plugin(kube_world, plugin, 6)
    kube_world.fleet.taint(spot, SPOT_ITN_TAINT, value="1700000000")
    not_ready(kube_world, down)

    signals = provider.health_signals(info)
    got = {(s.node, s.kind, s.severity) for s in signals}
    # Every node but `healthy` lacks the monitoring agent's condition: not
    # a signal (the agent has not reported yet), nor is the node lifecycle
    # controller's own not-ready taint. A node not Ready is no signal either:
    # it is a state (NodeInfo.ready), which the cluster reconcile fails only
    # past its grace.
    assert got == {(xid, "xid", "critical"), (dbe, "ecc", "critical"),
                   (plugin, "xid", "critical"), (spot, "spot_notice", "critical")}
    assert not {n.name: n for n in provider.list_nodes(info)}[down].ready
    by_node = {s.node: s for s in signals}
    assert "GPU has fallen off the bus" in by_node[xid].message
    assert by_node[xid].evidence["condition"]["reason"] == "NvidiaXID79Error"
    assert by_node[plugin].evidence == {"capacity": 8, "allocatable": 6}
    # Seen again on the next sweep, the same signals carry the same keys.
    assert {s.key for s in provider.health_signals(info)} == {s.key for s in signals}
    assert len({s.key for s in signals}) == len(signals)


def test_labels_a_health_checker_sets_become_signals_when_configured(kube_world, calls):
    provider = provider_for(calls, health_labels={"example.com/gpu-health": "passed"})
    pool, info = kwok_pool(kube_world, size=3)
    ok, bad, _unchecked = (pool.node_name(i) for i in range(3))
    kube_world.core.patch_node(ok, {"metadata": {"labels": {"example.com/gpu-health": "passed"}}})
    kube_world.core.patch_node(bad, {"metadata": {"labels": {"example.com/gpu-health": "xid-79"}}})
    (signal,) = provider.health_signals(info)
    assert (signal.node, signal.kind, signal.severity) == (bad, "xid", "critical")
    assert signal.evidence == {"label": "example.com/gpu-health", "value": "xid-79"}


# --- preflight ------------------------------------------------------------------
# The allreduce check runs beside the passes (PreflightResult.pending): the
# first call starts its job, each later one with the same placements finds
# that job and answers pending until it ended or timed out, then the result.

def preflight_pods(world, count):
    """The preflight job's name and its pods by node, once all run."""
    jobs = world.custom.list_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs")["items"]
    names = [j["metadata"]["name"] for j in jobs
             if j["metadata"]["name"].startswith("regatta-preflight-")]
    if len(names) != 1:
        return None
    pods = pods_by_node(world, names[0], count)
    return (names[0], pods) if pods else None


def play_preflight(world, logs, outcome, count):
    """What the preflight's containers do: each prints its report and exits.
    A rank where `outcome` says the node fails exits 1 first (it breaks the
    collective); the job then fails and the check removes it, so the other
    ranks are left as they are. Otherwise every rank exits 0."""
    name, pods = eventually(lambda: preflight_pods(world, count), timeout=60, interval=0.2,
                            what="the preflight's pods to run")
    broken = [pod.metadata.name for node, pod in pods.items() if not outcome.get(node, True)]
    for pod in pods.values():
        logs.text[(NS, pod.metadata.name)] = "warming up\n" + (
            "RuntimeError: NCCL error\n" if pod.metadata.name in broken
            else '{"rank": 0, "ok": true, "busbw_gbps": 42.5}\n')
    for pod in broken:
        world.fleet.fail_pod(NS, pod, exit_code=1, message="RuntimeError: NCCL error")
    for pod in () if broken else pods.values():
        world.fleet.succeed_pod(NS, pod.metadata.name)
    return name


def started_preflight(provider, info, placements, **kw):
    """The first call: it starts the check and answers at once."""
    first = provider.preflight(info, placements, **kw)
    assert first.pending and not first.ok, first
    return first


def preflight_result(provider, info, placements, **kw):
    """Ask again, as later passes do, until the check has an answer."""
    def answered():
        result = provider.preflight(info, placements, **kw)
        return None if result.pending else result
    return eventually(answered, timeout=60, interval=0.5, what="the preflight's result")


def test_preflight_runs_an_allreduce_job_and_reports_bandwidth(kube_world, calls, provider):
    pool, info = kwok_pool(kube_world, size=2)
    logs = PodLogs().install(provider)
    placements = (Placement(pool.node_name(0), 0), Placement(pool.node_name(1), 1))
    first = started_preflight(provider, info, placements, timeout_s=60)
    name = play_preflight(kube_world, logs, {}, 2)
    assert first.evidence["job"] == name
    result = preflight_result(provider, info, placements, timeout_s=60)
    assert result.ok, result.message
    assert result.evidence["method"] == "allreduce" and result.evidence["job"] == name
    assert result.evidence["allreduce_gbps"] == 42.5
    assert set(result.evidence["per_node"]) == {pool.node_name(0), pool.node_name(1)}
    # Each later call found the check it started by the placements' label;
    # nothing watched it.
    looks = {c.query.get("labelSelector") for c in calls.calls("GET", JOBS)
             if c.query.get("watch") != "True"}
    assert f"{LABEL_CHECKS}={checks_label(placements)}" in looks
    assert not [c for c in calls.calls("GET", JOBS) if c.query.get("watch") == "True"]
    # The check cleans up after itself, and its result is given once.
    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="the preflight job to go")


def test_preflight_names_the_node_whose_rank_failed(kube_world, provider):
    pool, info = kwok_pool(kube_world, size=3)
    logs = PodLogs().install(provider)
    placements = tuple(Placement(pool.node_name(i), i) for i in range(3))
    started_preflight(provider, info, placements, timeout_s=60)
    play_preflight(kube_world, logs, {pool.node_name(1): False}, 3)
    result = preflight_result(provider, info, placements, timeout_s=60)
    assert not result.ok
    assert result.failed_nodes == (pool.node_name(1),)
    assert pool.node_name(1) in result.message


def test_preflight_that_never_finishes_times_out_without_blaming_a_node(kube_world, calls,
                                                                        provider):
    pool, info = kwok_pool(kube_world, size=1)
    placements = (Placement(pool.node_name(0), 0),)
    first = started_preflight(provider, info, placements, timeout_s=3)
    # Its pods run on and never exit: once 3 s have passed since the job was
    # made, the next call gives up on it.
    eventually(lambda: preflight_pods(kube_world, 1), timeout=60, interval=0.2,
               what="the preflight's pods to run")
    result = preflight_result(provider, info, placements, timeout_s=3)
    assert not result.ok and result.failed_nodes == ()
    assert "did not finish" in result.message
    name = first.evidence["job"]
    assert {c.path.rsplit("/", 1)[-1] for c in calls.calls("DELETE", JOBS)} == {name}
    eventually(lambda: kube_world.pytorchjob(name) is None, timeout=60, interval=0.2,
               what="the preflight job to go")


def test_an_informer_the_account_may_not_list_or_watch_is_permanent(kube_world,
                                                                    cleanup_identities):
    """A token that may get PyTorchJobs but not list or watch them (a Role
    older than the informers): the informer's list answers 403, and every
    read of its cache fails as permanent, in the server's words, at once."""
    pool, info = kwok_pool(kube_world, size=1)
    admin_provider = KubernetesProvider(kube_world.admin, KubeSettings(request_timeout_s=10))
    ref = admin_provider.launch(request_on(pool, info))
    cleanup_identities.append("regatta-no-watch")
    api = other_identity(kube_world, "regatta-no-watch", rules=[{
        "apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get"]}])
    cache = ClusterCache(api, NS, "app.kubernetes.io/managed-by=regatta", request_timeout(10))
    try:
        provider = KubernetesProvider(api, KubeSettings(request_timeout_s=10), cache=cache)
        with pytest.raises(PermanentError, match="403"):
            provider.observe(ref)
    finally:
        cache.stop()


def test_preflight_can_be_delegated_to_dcgm_health_checks(kube_world, calls):
    provider = provider_for(calls, preflight="dcgm-labels")
    pool, info = kwok_pool(kube_world, size=2)
    n1, n2 = pool.node_name(0), pool.node_name(1)
    as_monitoring_agent(kube_world, n1, "True", "Ok")
    as_monitoring_agent(kube_world, n2, "False", "DCGMDiagFailure")
    result = provider.preflight(info, (Placement(n1, 0), Placement(n2, 1),
                                       Placement("nowhere-9", 2)))
    assert not result.ok
    assert result.failed_nodes == (n2, "nowhere-9")
    assert result.evidence["note"] == "delegated to DCGM health checks"
    assert calls.calls("POST") == []  # no pods were started
    healthy = provider.preflight(info, (Placement(n1, 0),))
    assert healthy.ok and healthy.evidence["method"] == "dcgm-labels"


# --- wiring ---------------------------------------------------------------------

def test_the_registry_builds_it_from_the_clusters_settings(db, kube_world):
    pool = kube_world.make_pool(size=1)
    cluster = Cluster.objects.create(name="eks-a", provider=Cluster.Provider.KUBERNETES,
                                     settings={"kubeconfig": str(kube_world.regatta_kubeconfig),
                                               "namespace": "team-a"})
    row = NodePool.objects.create(cluster=cluster, name=pool.name, gpus_per_node=8,
                                  node_selector=pool.selector)
    provider = get_provider(cluster)
    assert isinstance(provider, KubernetesProvider) and provider.ns == "team-a"
    assert [n.name for n in provider.list_nodes(pool_info(row))] == [pool.node_name(0)]


def test_a_cluster_without_connection_settings_is_refused(db):
    cluster = Cluster.objects.create(name="eks-b", provider=Cluster.Provider.KUBERNETES,
                                     settings={})
    with pytest.raises(PermanentError, match="in_cluster"):
        get_provider(cluster)
    cluster.settings = {"kubeconfig": "/nonexistent/kubeconfig"}
    with pytest.raises(PermanentError, match="credentials"):
        get_provider(cluster)


# --- faults the test cluster cannot be made to produce yet ------------------------
# Still on tests/support/k8s_standin.py: an API server that throttles one
# request (a 429 with the server's Retry-After), or ends a watch with an
# ERROR event. See the stand-in's docstring for why each is not provoked on
# the real cluster yet.

@pytest.fixture
def standin():
    with st.K8sStandIn() as server:
        yield server


@pytest.fixture
def standin_provider(standin):
    return KubernetesProvider(standin.api_client(), KubeSettings(request_timeout_s=5),
                              sleep=lambda s: None)


def test_throttling_is_temporary_and_honours_retry_after(standin, standin_provider):
    standin.fail_next("POST", st.namespaced(NS, "secrets"), 429, headers={"Retry-After": "17"})
    with pytest.raises(TemporaryError) as caught:
        standin_provider.launch(make_request())
    assert caught.value.delay == 17.0
    assert standin.store.get(st.namespaced(NS, "secrets"), {}) == {}
    standin_provider.launch(make_request())  # the retry finishes the launch
    assert set(standin.store[st.namespaced(NS, "secrets")]) == {"job-7-a2-token"}
    assert len(standin.store[st.pytorchjobs(NS)]) == 1


@pytest.fixture
def standin_cache(standin):
    cache = ClusterCache(standin.api_client(), NS, "app.kubernetes.io/managed-by=regatta",
                         request_timeout(5))
    yield cache
    cache.stop()


def standin_job(standin, *conditions):
    return standin.put(st.pytorchjobs(NS), {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "job-7-a2", "namespace": NS},
        "status": {"conditions": [st.job_condition(c) for c in conditions]}})


def test_a_watch_that_expires_with_410_gone_relists_and_watches_again(standin,
                                                                    standin_cache):
    jobs = st.pytorchjobs(NS)
    standin_job(standin, "Running")
    watches = []

    def stream():
        watches.append(1)
        if len(watches) == 1:
            # The job finished while the watch was being expired.
            standin.get(jobs, "job-7-a2")["status"]["conditions"].append(
                st.job_condition("Succeeded"))
            return [st.watch_error(410, "too old resource version: 5 (9)")]
        return []

    standin.watch_events[jobs] = stream
    provider = KubernetesProvider(standin.api_client(), KubeSettings(request_timeout_s=5),
                                  cache=standin_cache)

    def finished():
        job = provider.reads.job(PYTORCHJOB, "job-7-a2")
        return job if job["status"]["conditions"][-1]["type"] == "Succeeded" else None

    eventually(finished, timeout=10, interval=0.1, what="the relist to bring the change")
    watching = [c.query.get("watch", "").lower() == "true" for c in standin.calls("GET", jobs)]
    assert watching[:3] == [False, True, False]  # list, watch (410), list again
    first_watch = standin.calls("GET", jobs)[1]
    # Watched from the list's resourceVersion, with bookmarks.
    assert first_watch.query["resourceVersion"]
    assert first_watch.query["allowWatchBookmarks"].lower() == "true"
    assert standin_cache.informer("pytorchjobs").lists == 2


def test_a_watch_error_event_is_classed_by_its_status(standin, standin_cache):
    jobs = st.pytorchjobs(NS)
    standin_job(standin, "Running")
    standin.watch_events[jobs] = [st.watch_error(500)]
    provider = KubernetesProvider(standin.api_client(), KubeSettings(request_timeout_s=5),
                                  cache=standin_cache)

    def refused():
        try:
            provider.reads.job(PYTORCHJOB, "job-7-a2")
        except TemporaryError as exc:
            return exc
        return None

    # The cache the broken watch leaves may be stale: reads say so, as temporary.
    caught = eventually(refused, timeout=10, interval=0.05, what="reads to see the watch broken")
    assert "500" in str(caught) and "stale" in str(caught)
    # Once the server's watches answer again, so do the reads.
    standin.watch_events.pop(jobs)
    eventually(lambda: refused() is None, timeout=30, interval=0.1,
               what="reads to answer again")
