"""Kueue in the test cluster: its controller, CRDs and webhooks, for real.

The controller is built from the module in go/trainer (build.py), its CRDs
and webhook configurations come from the same module source, as Kueue's
kustomizations patch them: the conversion webhook on the five CRDs that
convert v1beta1 <-> v1beta2 (a client that still reads v1beta1 Workloads is
answered through it, as on a cluster), and the namespace selectors that keep
the pod, Deployment and StatefulSet webhooks out of kube-system and
kueue-system. Every webhook is called by URL (webhooks.py). The one edit to
Kueue's source is where it reads its metrics certificate (build.py).

Kueue manages only jobs that carry the LocalQueue label
(`manageJobsWithoutQueueName` is off, its default), so the rest of the
cluster's jobs run as they would without it. A test or a person makes the
queues themselves (`queues`).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from . import build, pki, webhooks

KUEUE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
# The frameworks whose jobs Kueue admits here: the kinds Regatta makes, and
# the JobSet and Jobs a TrainJob becomes (Kueue admits the TrainJob and
# leaves its children to it).
FRAMEWORKS = ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob",
              "jobset.x-k8s.io/jobset", "batch/job")
# Kueue's kustomization names its objects with this prefix.
PREFIX = "kueue-"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _source() -> Path:
    return build.module_dir(build.TRAINER_MOD, KUEUE) / "config" / "components"


def _crds() -> tuple[list[dict], set[str]]:
    """crd/kustomization.yaml's CRDs, and the names of those its patches give
    the conversion webhook."""
    folder = _source() / "crd"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    converted = {yaml.safe_load((folder / p["path"]).read_text())["metadata"]["name"]
                 for p in kustomization.get("patches", [])
                 if Path(p["path"]).name.startswith("webhook_in_")}
    docs = [d for name in kustomization["resources"] for d in _docs(folder / name)]
    return docs, converted


def crd_docs(port: int, ca_bundle: bytes) -> list[dict]:
    """The CRDs, with the conversion webhook called by URL."""
    docs, converted = _crds()
    for doc in docs:
        if doc["metadata"]["name"] in converted:
            doc["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {"clientConfig": webhooks.client_config(port, "/convert", ca_bundle),
                            "conversionReviewVersions": ["v1"]}}
    return docs


def webhook_configurations(port: int, ca_bundle: bytes) -> list[dict]:
    """webhook/manifests.yaml with webhook/kustomization.yaml's strategic
    merge patches (namespace selectors, merged by webhook name)."""
    folder = _source() / "webhook"
    docs = _docs(folder / "manifests.yaml")
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    for entry in kustomization.get("patches", []):
        patch = yaml.safe_load(entry["patch"])
        doc = next(d for d in docs if d["kind"] == patch["kind"]
                   and d["metadata"]["name"] == patch["metadata"]["name"])
        by_name = {h["name"]: h for h in doc["webhooks"]}
        for hook in patch["webhooks"]:
            by_name[hook["name"]].update({k: v for k, v in hook.items() if k != "name"})
    for doc in docs:
        doc["metadata"] = {"name": PREFIX + doc["metadata"]["name"]}
        webhooks.by_url(doc, port, ca_bundle)
    return docs


def configure(state: Path, port: int) -> dict:
    """The certificate and configuration file of the controller; returns its
    arguments and environment."""
    certs = state / "kueue" / "certs"
    pki.serving_cert(certs, state / "pki", "kueue-webhook")
    cfg = state / "kueue" / "config.yaml"
    cfg.write_text(json.dumps({
        "apiVersion": f"config.{GROUP}/{VERSION}", "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }))
    return {
        # The on-demand visibility API is an aggregated API server of its own
        # on a fixed port, which two clusters on one machine would share;
        # Regatta reads Workloads, not it.
        "args": [f"--config={cfg}", "--feature-gates=VisibilityOnDemand=false"],
        # Read by the one edit to Kueue's source (build.KUEUE_METRICS_CERTS);
        # the metrics server itself is off (bindAddress 0).
        "env": {"REGATTA_KUEUE_METRICS_CERT_DIR": str(certs)},
    }


def namespace_doc() -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def queues(namespace: str, queue: str, flavor: str, quota: dict[str, str | int],
           node_labels: dict[str, str] | None = None) -> list[dict]:
    """A ResourceFlavor, a ClusterQueue with `quota` of that flavor, and a
    LocalQueue `queue` in `namespace` pointing at it: the least a platform
    team sets up before Kueue admits anything (docs/kubernetes.md)."""
    api = f"{GROUP}/{VERSION}"
    cluster_queue = f"{namespace}-{queue}"
    return [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": dict(node_labels or {})}},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
         "spec": {"namespaceSelector": {},
                  "resourceGroups": [{
                      "coveredResources": list(quota),
                      "flavors": [{"name": flavor, "resources": [
                          {"name": r, "nominalQuota": q} for r, q in quota.items()]}]}]}},
        {"apiVersion": api, "kind": "LocalQueue",
         "metadata": {"name": queue, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}},
    ]
