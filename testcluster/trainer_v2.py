"""Kubeflow Trainer v2 and the JobSet controller in the test cluster.

Both come from the module in go/trainer (the Trainer's release pins the
JobSet it is tested with), their CRDs from the same module sources, and
their admission webhooks run for real, called by URL (webhooks.py): the
modules' own webhook configurations, as their kustomizations patch them. So
a TrainJob is defaulted and validated by the Trainer, and a JobSet and its
pods by JobSet, exactly as on a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from . import build, pki, webhooks

TRAINER = "github.com/kubeflow/trainer/v2"
JOBSET = "sigs.k8s.io/jobset"
# The names the Trainer's main.go gives its webhook configurations (its cert
# rotator would look them up by these); JobSet's, prefixed so the two
# modules' `mutating-webhook-configuration` do not collide.
WEBHOOK_NAMES = {
    (TRAINER, "MutatingWebhookConfiguration"): "defaulter.trainer.kubeflow.org",
    (TRAINER, "ValidatingWebhookConfiguration"): "validator.trainer.kubeflow.org",
    (JOBSET, "MutatingWebhookConfiguration"): "jobset-mutating-webhook-configuration",
    (JOBSET, "ValidatingWebhookConfiguration"): "jobset-validating-webhook-configuration",
}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _source(module: str) -> Path:
    return build.module_dir(build.TRAINER_MOD, module)


def crd_docs() -> list[dict]:
    trainer = _source(TRAINER) / "manifests" / "base" / "crds"
    jobset = _source(JOBSET) / "config" / "components" / "crd" / "bases"
    return [d for path in sorted(trainer.glob("*.yaml")) + sorted(jobset.glob("*.yaml"))
            if path.name != "kustomization.yaml" for d in _docs(path)]


def _patched(docs: list[dict], patches: Path) -> list[dict]:
    """JobSet's kustomization replaces its pod webhooks with ones that only
    see JobSet's pods (an objectSelector); the same JSON patches here."""
    for patch, kind in (("mutating-patch.yaml", "MutatingWebhookConfiguration"),
                        ("validating-patch.yaml", "ValidatingWebhookConfiguration")):
        doc = next(d for d in docs if d["kind"] == kind)
        for op in yaml.safe_load((patches / patch).read_text()):
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
    return docs


def webhook_configurations(ports: dict[str, int], ca_bundle: bytes) -> list[dict]:
    """The modules' webhook configurations, each webhook called by URL at
    its controller's loopback port."""
    found = {
        TRAINER: _docs(_source(TRAINER) / "manifests" / "base" / "webhook" / "manifests.yaml"),
        JOBSET: _patched(
            _docs(_source(JOBSET) / "config" / "components" / "webhook" / "manifests.yaml"),
            _source(JOBSET) / "config" / "components" / "webhook" / "patches"),
    }
    out = []
    for module, docs in found.items():
        for doc in docs:
            doc["metadata"] = {"name": WEBHOOK_NAMES[(module, doc["kind"])]}
            out.append(webhooks.by_url(doc, ports[module], ca_bundle))
    return out


def configure(state: Path, ports: dict[str, int]) -> dict[str, dict]:
    """Certificates and configuration files for the two controllers; returns
    each binary's arguments and environment."""
    pki_dir = state / "pki"
    jobset_certs = state / "jobset" / "certs"
    pki.serving_cert(jobset_certs, pki_dir, "jobset-webhook")
    # The Trainer's webhook server takes its certificates from
    # $TMPDIR/k8s-webhook-server/serving-certs (controller-runtime's
    # default; the Trainer's configuration has no field for it). A TMPDIR
    # of its own keeps them apart from the training-operator's, which uses
    # the same default under /tmp.
    trainer_tmp = state / "trainer" / "tmp"
    pki.serving_cert(trainer_tmp / "k8s-webhook-server" / "serving-certs", pki_dir,
                     "trainer-webhook")
    jobset_cfg = state / "jobset" / "config.yaml"
    jobset_cfg.write_text(json.dumps({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": ports[JOBSET], "host": "127.0.0.1", "certDir": str(jobset_certs)},
        "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"},
    }))
    trainer_cfg = state / "trainer" / "config.yaml"
    trainer_cfg.write_text(json.dumps({
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
        "webhook": {"port": ports[TRAINER], "host": "127.0.0.1"},
        "metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"},
    }))
    return {
        "jobset": {"args": [f"--config={jobset_cfg}"], "env": {}},
        "trainer-controller-manager": {"args": [f"--config={trainer_cfg}"],
                                       "env": {"TMPDIR": str(trainer_tmp)}},
    }


def runtime_docs() -> list[dict]:
    """The ClusterTrainingRuntime Regatta ships (deploy/trainjob/)."""
    folder = build.HERE.parent / "deploy" / "trainjob"
    listed = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    return [d for name in listed for d in _docs(folder / name)]
