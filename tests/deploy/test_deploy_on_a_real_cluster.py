"""deploy/ on a real API server (tests/support/kube_cluster.py): the
workloads pass its validation and admission, and the control plane's
ServiceAccount, acting with its own token, has exactly the rights the
Role and ClusterRole grant."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from testcluster import bootstrap
from tests.support.kube_cluster import TRAINING_NS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def as_regatta(kube):
    return bootstrap.api_client(kube.regatta_kubeconfig)


def allowed(api, verb, resource, namespace=None, group="", subresource=None) -> bool:
    review = k8s.V1SelfSubjectAccessReview(spec=k8s.V1SelfSubjectAccessReviewSpec(
        resource_attributes=k8s.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=namespace,
            subresource=subresource)))
    return k8s.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed


def test_the_control_planes_workloads_pass_the_api_servers_validation(kube):
    result = bootstrap.apply_deploy(kube.admin)
    validated = {(d["kind"], d["metadata"]["name"]) for d in result["validated"]}
    assert {k for k, _ in validated} >= {"Deployment", "Job"}
    # A dry run stores nothing.
    apps = k8s.AppsV1Api(kube.admin)
    assert apps.list_namespaced_deployment("regatta").items == []


def test_the_token_is_the_control_planes_service_account(as_regatta):
    review = k8s.AuthenticationV1Api(as_regatta).create_self_subject_review(
        k8s.V1SelfSubjectReview())
    user = review.status.user_info
    assert user.username == "system:serviceaccount:regatta:regatta-control-plane"
    assert "system:masters" not in (user.groups or [])


@pytest.mark.parametrize("verb,resource,group,subresource", [
    ("create", "pytorchjobs", "kubeflow.org", None),
    ("delete", "pytorchjobs", "kubeflow.org", None),
    ("watch", "pytorchjobs", "kubeflow.org", None),
    ("create", "trainjobs", "trainer.kubeflow.org", None),
    ("delete", "trainjobs", "trainer.kubeflow.org", None),
    ("watch", "trainjobs", "trainer.kubeflow.org", None),
    ("get", "jobsets", "jobset.x-k8s.io", None),
    ("list", "pods", "", None),
    ("patch", "pods", "", None),  # a failed pod kept for its log (kept_logs.py)
    ("create", "pods", "", "eviction"),
    ("get", "pods", "", "log"),
    ("create", "secrets", "", None),
])
def test_it_may_do_what_the_provider_does_in_the_training_namespace(
        as_regatta, verb, resource, group, subresource):
    assert allowed(as_regatta, verb, resource, TRAINING_NS, group, subresource)


@pytest.mark.parametrize("verb,resource,namespace,group", [
    # Only in the training namespace.
    ("create", "pytorchjobs", "default", "kubeflow.org"),
    ("list", "pods", "kube-system", ""),
    # Secrets: created, read back by name and deleted, never listed or changed.
    ("list", "secrets", TRAINING_NS, ""),
    ("update", "secrets", TRAINING_NS, ""),
    # A TrainJob's JobSet is the Trainer's: read, never changed.
    ("delete", "jobsets", TRAINING_NS, "jobset.x-k8s.io"),
    ("patch", "trainjobs", TRAINING_NS, "trainer.kubeflow.org"),
    # Pods are patched in the training namespace only.
    ("patch", "pods", "default", ""),
    # Nodes are patched (cordon) and deleted (replace), never made.
    ("create", "nodes", None, ""),
    ("create", "clusterrolebindings", None, "rbac.authorization.k8s.io"),
])
def test_it_may_do_nothing_more(as_regatta, verb, resource, namespace, group):
    assert not allowed(as_regatta, verb, resource, namespace, group)


def test_the_api_server_refuses_what_deploy_does_not_grant(as_regatta):
    core = k8s.CoreV1Api(as_regatta)
    with pytest.raises(k8s.ApiException) as refused:
        core.list_namespaced_secret(TRAINING_NS)
    assert refused.value.status == 403
    nodes = core.list_node()  # granted cluster-wide by the ClusterRole
    assert isinstance(nodes.items, list)
