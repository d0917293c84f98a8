"""What the cluster holds before Regatta uses it: the training-operator's
CRDs, Regatta's own deploy/ manifests, and a kubeconfig with Regatta's
ServiceAccount token.

Everything goes through the API server with the official client; manifests
are applied server-side, so the API server validates each field against its
schema (and prunes what a CRD's structural schema does not know) exactly as
`kubectl apply --server-side` would.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes import dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from . import build

REPO = Path(__file__).resolve().parent.parent
DEPLOY_BASE = REPO / "deploy" / "base"
FIELD_MANAGER = "regatta-testcluster"
# deploy/base's objects that hold no workload: applied for real. The rest
# (Deployments, the migration Job, ...) are applied with dryRun=All: the API
# server validates and admits them but stores nothing, since kwok would only
# pretend to run a control plane that is not built into an image here.
RBAC_KINDS = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
              "ClusterRoleBinding", "ConfigMap", "PriorityClass"}
CONTROL_PLANE_SA = ("regatta", "regatta-control-plane")


def api_client(kubeconfig: Path) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return k8s.ApiClient(cfg)


def apply(api: k8s.ApiClient, docs: list[dict], dry_run: bool = False) -> list[dict]:
    """Server-side apply of each object, in order; returns what the server kept."""
    dyn = dynamic.DynamicClient(api)
    out = []
    for doc in docs:
        resource = _resource(dyn, doc["apiVersion"], doc["kind"])
        kwargs = {"field_manager": FIELD_MANAGER, "force_conflicts": True}
        if dry_run:
            kwargs["dry_run"] = "All"
        if resource.namespaced:
            kwargs["namespace"] = doc["metadata"].get("namespace") or "default"
        result = resource.server_side_apply(body=doc, name=doc["metadata"]["name"], **kwargs)
        out.append(result.to_dict())
    return out


def _resource(dyn: dynamic.DynamicClient, api_version: str, kind: str):
    """The API resource that serves `kind`. A core kind ("v1") is looked up
    under /api alone: searched for in every group, "v1" is also asked of
    each CRD's group, and a CRD created a moment before is listed in
    discovery before its group answers (a 404 that failed every real-cluster
    test of a run at its start). A group's kind not served yet is waited
    for, discovery read again each time."""
    prefix = "apis" if "/" in api_version else "api"

    def served():
        try:
            return dyn.resources.get(prefix=prefix, api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            dyn.resources.invalidate_cache()
            return None

    return _until(f"the API server to serve {kind} ({api_version})", served)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def crd_docs() -> list[dict]:
    folder = build.module_dir(build.OPERATOR_MOD, "github.com/kubeflow/training-operator")
    return _docs(folder / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml")


def _until(what: str, check, timeout: float = 60.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except ApiException as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} ({last})")


def install_operator_prerequisites(cluster) -> None:
    """The PyTorchJob CRD from the operator's module, its namespace, and the
    empty Secret its cert rotator fills (the operator's own manifests ship
    that Secret empty too)."""
    from .cluster import NAMESPACE_OPERATOR, OPERATOR_WEBHOOK_SECRET

    api = api_client(cluster.admin_kubeconfig)
    apply(api, crd_docs())
    apply(api, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE_OPERATOR}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": OPERATOR_WEBHOOK_SECRET, "namespace": NAMESPACE_OPERATOR}},
        _webhook_configuration(),
    ])
    _until("the PyTorchJob CRD", lambda: established(api, ["pytorchjobs.kubeflow.org"]))


def established(api: k8s.ApiClient, names) -> bool:
    """Whether the API server serves each of these CRDs yet."""
    ext = k8s.ApiextensionsV1Api(api)
    for name in names:
        crd = ext.read_custom_resource_definition(name)
        if not any(c.type == "Established" and c.status == "True"
                   for c in crd.status.conditions or []):
            return False
    return True


def _webhook_configuration() -> dict:
    """The operator starts its controllers only once its cert rotator has
    put its CA into this configuration, so it must exist. Its one webhook
    has no rules: the API server would call it through the operator's
    Service, which nothing routes to on this machine, so PyTorchJobs are not
    checked by the operator's validating webhook here (docs/kubernetes.md)."""
    from .cluster import NAMESPACE_OPERATOR, OPERATOR_WEBHOOK_CONFIGURATION

    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": OPERATOR_WEBHOOK_CONFIGURATION},
        "webhooks": [{
            "name": "validator.pytorchjob.training-operator.kubeflow.org",
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"service": {"name": "training-operator",
                                         "namespace": NAMESPACE_OPERATOR,
                                         "path": "/validate-kubeflow-org-v1-pytorchjob"}},
            "rules": [],
        }],
    }


# Where the operator's cert rotator waits for its Secret to appear as files
# (fixed in its pkg/cert) before it starts any controller. In a pod, the
# kubelet mounts the Secret there; no kubelet runs here, so this copies it.
OPERATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


def _mount_webhook_certificate(core: k8s.CoreV1Api) -> bool:
    from .cluster import NAMESPACE_OPERATOR, OPERATOR_WEBHOOK_SECRET

    data = core.read_namespaced_secret(OPERATOR_WEBHOOK_SECRET, NAMESPACE_OPERATOR).data or {}
    if "tls.crt" not in data or "tls.key" not in data:
        return False
    OPERATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        if key in data:
            tmp = OPERATOR_CERT_DIR / f".{key}.{os.getpid()}"
            tmp.write_bytes(base64.b64decode(data[key]))
            tmp.replace(OPERATOR_CERT_DIR / key)
    return True


def wait_ready(cluster) -> None:
    """The controllers are up once they act: the controller-manager has made
    the `default` ServiceAccount, and the operator has started its workers."""
    api = api_client(cluster.admin_kubeconfig)
    core = k8s.CoreV1Api(api)
    cluster._wait("the controller-manager (default ServiceAccount)",
                  lambda: core.read_namespaced_service_account("default", "default"), 60)
    cluster._wait("the training-operator's webhook certificate",
                  lambda: _mount_webhook_certificate(core), 60)
    log = cluster.logs / "training-operator.log"

    def controller_started():
        return any("Starting workers" in line and "pytorchjob" in line
                   for line in log.read_text(errors="replace").splitlines())

    cluster._wait("the training-operator's PyTorchJob controller", controller_started, 60)


def apply_deploy(api: k8s.ApiClient, base: Path = DEPLOY_BASE) -> dict[str, list[dict]]:
    """deploy/base as its kustomization lists it: the namespaces, the
    ServiceAccount and its roles for real; the workloads validated only."""
    listed = yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]
    docs = [d for name in listed for d in _docs(base / name)]
    kept = [d for d in docs if d["kind"] in RBAC_KINDS]
    # Namespaces before what lives in them.
    kept.sort(key=lambda d: d["kind"] != "Namespace")
    checked = [d for d in docs if d["kind"] not in RBAC_KINDS]
    return {"applied": apply(api, kept), "validated": apply(api, checked, dry_run=True)}


def service_account_token(api: k8s.ApiClient, namespace: str, name: str,
                          seconds: int = 24 * 3600) -> str:
    """A bound token of the ServiceAccount (TokenRequest API), as the kubelet
    projects into a pod that runs as it."""
    core = k8s.CoreV1Api(api)
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds))
    return core.create_namespaced_service_account_token(name, namespace, request).status.token


def regatta_kubeconfig(cluster, path: Path | None = None) -> Path:
    """deploy/ applied, and a kubeconfig that acts as Regatta's control plane
    ServiceAccount: exactly the rights deploy/ grants it."""
    api = api_client(cluster.admin_kubeconfig)
    apply_deploy(api)
    from .trainer_v2 import runtime_docs

    # What a cluster with job_api trainjob installs beside deploy/base.
    apply(api, runtime_docs())
    namespace, name = CONTROL_PLANE_SA
    token = service_account_token(api, namespace, name)
    return cluster.write_kubeconfig(path or cluster.state / "regatta.kubeconfig", token,
                                    f"system:serviceaccount:{namespace}:{name}")
