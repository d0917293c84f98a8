"""The manifests that run Regatta itself on Kubernetes (deploy/).

These tests parse every file, check each object against the official
`kubernetes` models (a misspelled field is dropped on the way in, so the
round trip would differ), and pin the RBAC to exactly the verbs the
Kubernetes provider uses; the last of those runs a full cycle on the real
test cluster (tests/support/kube_cluster.py) with deploy/'s token.
"""

from pathlib import Path

import pytest
import yaml

from clusters.providers.base import Placement
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes.manifests import from_dict, to_dict
from testcluster import bootstrap
from tests.clusters.providers.kubernetes.test_manifests import make_pool, make_request
from tests.support.kube_calls import Recorder
from tests.support.kube_cluster import TRAINING_NS
from tests.support.waiting import eventually

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
FILES = sorted(DEPLOY.rglob("*.yaml"))
MODELS = {
    "Namespace": "V1Namespace", "ServiceAccount": "V1ServiceAccount", "Role": "V1Role",
    "RoleBinding": "V1RoleBinding", "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding", "ConfigMap": "V1ConfigMap",
    "Secret": "V1Secret", "Deployment": "V1Deployment", "Service": "V1Service",
    "Job": "V1Job", "Ingress": "V1Ingress", "PriorityClass": "V1PriorityClass",
}


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects(under="base"):
    found = {}
    for path in sorted((DEPLOY / under).glob("*.yaml")):
        for doc in docs(path):
            if doc["kind"] != "Kustomization":
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def test_there_are_manifests_to_check():
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_object_parses_and_matches_the_kubernetes_models(path):
    for doc in docs(path):
        kind = doc["kind"]
        if kind == "Kustomization":
            assert doc["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
            for resource in doc["resources"]:
                if resource.startswith("github.com/"):
                    continue  # an upstream base, pinned by its ref
                assert (path.parent / resource).exists(), resource
            for generator in doc.get("configMapGenerator", []):
                for name in generator["files"]:
                    assert (path.parent / name).exists(), name
            continue
        if kind == "ServiceMonitor":  # the Prometheus Operator's CRD: no client model
            continue  # test_the_service_monitor_scrapes_the_web_services_metrics
        if kind == "ClusterTrainingRuntime":  # Trainer v2's CRD: no client model; the
            continue  # test cluster applies it through the Trainer's own webhook
        assert kind in MODELS, f"{path.name}: unexpected kind {kind}"
        assert to_dict(from_dict(doc, MODELS[kind])) == doc


def test_the_base_lists_every_file_beside_it():
    kustomization = docs(DEPLOY / "base" / "kustomization.yaml")[0]
    beside = {p.name for p in (DEPLOY / "base").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == beside


def test_the_base_runs_web_worker_beat_and_the_migration():
    found = objects()
    assert set(found) >= {
        ("Deployment", "regatta-web"), ("Deployment", "regatta-worker"),
        ("Deployment", "regatta-beat"), ("Job", "regatta-migrate"),
        ("Service", "regatta-web"), ("ServiceAccount", "regatta-control-plane"),
        ("Namespace", "regatta"), ("Namespace", "regatta-training"),
    }
    beat = found[("Deployment", "regatta-beat")]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"] == {"type": "Recreate"}
    web = found[("Deployment", "regatta-web")]["spec"]["template"]["spec"]["containers"][0]
    assert web["command"][0] == "granian"
    assert web["command"][-2:] == ["--factory", "controlplane.wsgi:serve"]
    assert web["readinessProbe"]["httpGet"]["path"] == "/login/"
    assert "tcpSocket" in web["livenessProbe"]
    migrate = found[("Job", "regatta-migrate")]["spec"]["template"]["spec"]["containers"][0]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    examples = {d["kind"] for p in (DEPLOY / "examples").glob("*.yaml") for d in docs(p)}
    assert examples == {"Ingress", "Secret"}


def test_database_redis_and_secret_key_come_from_a_secret():
    for (kind, name), doc in objects().items():
        if kind not in ("Deployment", "Job"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            for key in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY"):
                assert env[key]["valueFrom"]["secretKeyRef"] == {
                    "name": "regatta-secrets", "key": key}, (name, key)
                assert "value" not in env[key]


def test_the_web_behind_the_ingress_is_configured_for_https():
    """TLS ends at the ingress: the config names the header it sets, trusts
    its one X-Forwarded-For entry, and sets HSTS and the content policy,
    each a value the settings accept."""
    from django.conf import settings

    from controlplane.settings import _proxy_ssl_header

    config = objects()[("ConfigMap", "regatta-config")]["data"]
    assert _proxy_ssl_header(config["REGATTA_PROXY_SSL_HEADER"]) == (
        "HTTP_X_FORWARDED_PROTO", "https")
    assert config["REGATTA_TRUSTED_PROXIES"] == "1"
    assert int(config["REGATTA_HSTS_SECONDS"]) >= 31_536_000
    assert config["REGATTA_CSP"] == settings.DEFAULT_CSP
    ingress = docs(DEPLOY / "examples" / "ingress.yaml")[0]
    assert ingress["spec"]["tls"], "the example ingress terminates TLS"


def rules(doc):
    """{(apiGroups, resource): verbs}; one resource per rule keeps it plain."""
    assert all(len(r["resources"]) == 1 for r in doc["rules"])
    return {(tuple(r["apiGroups"]), r["resources"][0]): sorted(r["verbs"])
            for r in doc["rules"]}


def test_the_control_plane_gets_exactly_the_verbs_it_uses():
    found = objects()
    role = found[("Role", "regatta-control-plane")]
    assert role["metadata"]["namespace"] == "regatta-training"
    assert rules(role) == {
        (("kubeflow.org",), "pytorchjobs"): sorted(["create", "get", "list", "watch", "delete"]),
        (("trainer.kubeflow.org",), "trainjobs"): sorted(["create", "get", "list", "watch",
                                                          "delete"]),
        (("jobset.x-k8s.io",), "jobsets"): sorted(["get", "list", "watch"]),
        (("",), "pods"): sorted(["get", "list", "watch", "create", "delete", "patch"]),
        (("",), "pods/eviction"): ["create"],
        (("",), "pods/log"): ["get"],
        (("",), "secrets"): sorted(["create", "delete", "get"]),
        (("",), "events"): sorted(["get", "list", "watch"]),
        (("kueue.x-k8s.io",), "workloads"): sorted(["list", "watch"]),
        (("scheduling.volcano.sh",), "podgroups"): ["get"],
    }
    assert len(role["rules"]) == 10
    nodes = found[("ClusterRole", "regatta-nodes")]
    assert rules(nodes) == {
        (("",), "nodes"): sorted(["get", "list", "watch", "patch", "delete"])}
    roles = [k for k in found if k[0] in ("Role", "ClusterRole")]
    assert sorted(roles) == [("ClusterRole", "regatta-nodes"), ("Role", "regatta-control-plane")]


def test_each_role_is_bound_to_the_control_planes_service_account_only():
    found = objects()
    for kind, role_kind, name in (("RoleBinding", "Role", "regatta-control-plane"),
                                  ("ClusterRoleBinding", "ClusterRole", "regatta-nodes")):
        binding = found[(kind, name)]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": role_kind, "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount",
                                        "name": "regatta-control-plane",
                                        "namespace": "regatta"}]
    bindings = [d for (kind, _), d in found.items() if kind.endswith("Binding")]
    assert len(bindings) == 2


def test_only_the_worker_runs_with_the_control_planes_rights():
    """The worker reconciles and so calls the provider; web and beat never do
    and carry no token, so a compromised web pod cannot touch PyTorchJobs,
    Secrets or nodes."""
    found = objects()
    worker = found[("Deployment", "regatta-worker")]["spec"]["template"]["spec"]
    assert worker["serviceAccountName"] == "regatta-control-plane"
    assert worker.get("automountServiceAccountToken", True) is True
    web = found[("Deployment", "regatta-web")]["spec"]["template"]["spec"]
    assert web["serviceAccountName"] == "regatta-web"
    assert web["automountServiceAccountToken"] is False
    account = found[("ServiceAccount", "regatta-web")]
    assert account["automountServiceAccountToken"] is False
    subjects = [s["name"] for (kind, _), d in found.items() if kind.endswith("Binding")
                for s in d["subjects"]]
    assert "regatta-web" not in subjects
    beat = found[("Deployment", "regatta-beat")]["spec"]["template"]["spec"]
    assert beat["automountServiceAccountToken"] is False
    assert beat.get("serviceAccountName") != "regatta-control-plane"
    migrate = found[("Job", "regatta-migrate")]["spec"]["template"]["spec"]
    assert migrate["automountServiceAccountToken"] is False


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_provider_calls_only_what_the_role_grants(kube_world):
    """A full cycle on the real API server with deploy/'s ServiceAccount
    token: launch, observe, drain, stop, preflight, replace. The server's
    RBAC refuses anything the Role does not grant (a 403 fails the cycle),
    and each request recorded maps to a granted verb."""
    verbs = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}
    pool = kube_world.make_pool(size=1)
    node = pool.node_name(0)
    info = make_pool(name=pool.name, node_selector=pool.selector)
    calls = Recorder(bootstrap.api_client(kube_world.regatta_kubeconfig))
    provider = KubernetesProvider(calls.api, KubeSettings(preflight="dcgm-labels",
                                                          request_timeout_s=10))
    request = make_request(nodes=(node,), pool=info)
    ref = provider.launch(request)
    pod = eventually(lambda: next((p.metadata.name for p in kube_world.pods(
        "training.kubeflow.org/job-name=job-7-a2") if p.status.phase == "Running"), None),
        timeout=60, interval=0.2, what="the job's pod to run")
    kube_world.fleet.fail_pod(TRAINING_NS, pod, exit_code=1)
    eventually(lambda: kube_world.core.read_namespaced_pod(pod, TRAINING_NS).status.phase
               == "Failed", timeout=30, interval=0.2, what="kwok to fail the container")
    provider.observe(ref)
    provider.drain(info, node)
    provider.health_signals(info)
    provider.preflight(info, (Placement(node, 0),))
    provider.stop(ref)
    eventually(lambda: kube_world.pytorchjob("job-7-a2") is None, timeout=60, interval=0.2,
               what="the stopped job to go")
    provider.launch(request)
    provider.launch(request)  # a relaunch replaces its secret
    karpenter = make_pool(name=pool.name, node_selector=pool.selector,
                          settings={"node_autoscaler": "karpenter"})
    provider.replace(karpenter, node)  # deletes the Node, asks a capacity pod
    provider.provision_node(karpenter, "spare-0")
    provider.list_nodes(karpenter)
    provider.launch(make_request(name="job-7-k", nodes=(node,), pool=karpenter))
    # A gang not started yet: its Kueue Workload or Volcano PodGroup is read
    # (neither is installed here: the API server answers 404 after RBAC).
    for gang in ("kueue", "volcano"):
        provider = KubernetesProvider(calls.api, KubeSettings(
            preflight="dcgm-labels", gang_scheduler=gang, queue="q", request_timeout_s=10))
        provider.observe(provider.launch(make_request(name=f"job-7-{gang}", nodes=(node,),
                                                      pool=info)))
    assert calls.calls("DELETE", f"/api/v1/nodes/{node}")
    assert not [c for c in calls.made if c.status == 403]
    granted = set()
    for doc in objects().values():
        if doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                granted |= {(rule["resources"][0], v) for v in rule["verbs"]}
    for call in calls.made:
        parts = call.path.strip("/").split("/")
        resource = parts[-1] if call.method in ("GET", "POST") and parts[-1] in (
            "nodes", "pods", "secrets", "pytorchjobs", "workloads", "events") else None
        if parts[-1] in ("eviction", "log"):
            resource = f"pods/{parts[-1]}"
        elif resource is None:
            resource = parts[-2]
        verb = verbs.get(call.method) or (
            "watch" if call.query.get("watch") else "list" if resource == parts[-1] else "get")
        assert (resource, verb) in granted, (call.method, call.path)


def test_every_long_running_process_is_restarted_when_it_exits():
    # A Deployment's pods restart on exit (Always is the only policy it
    # allows); a bare Pod, a ReplicaSet or a Job running a server would not.
    found = objects()
    for (kind, name), obj in found.items():
        spec = obj.get("spec", {}).get("template", {}).get("spec")
        if spec is None:
            continue
        if kind == "Job":
            assert name == "regatta-migrate" and spec["restartPolicy"] == "OnFailure"
            continue
        assert kind == "Deployment", (kind, name)
        assert spec.get("restartPolicy", "Always") == "Always", name


def test_the_service_monitor_scrapes_the_web_services_metrics():
    """The ServiceMonitor selects the web Service, names a port it has, and
    sends the token from the Secret the web pods read REGATTA_METRICS_TOKEN
    from (deploy/examples/secret.yaml)."""
    (monitor,) = docs(DEPLOY / "monitoring" / "servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = objects()[("Service", "regatta-web")]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    secret = endpoint["bearerTokenSecret"]
    example = {d["metadata"]["name"]: d for p in (DEPLOY / "examples").glob("*.yaml")
               for d in docs(p) if d["kind"] == "Secret"}
    assert secret["key"] in example[secret["name"]].get("stringData", {})
