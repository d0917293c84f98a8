"""The EKS overlay (deploy/overlays/eks): the base plus S3 checkpoints, IRSA
for the control plane and a trainer ServiceAccount.

No cluster can run here. `render` applies the overlay the way kustomize
does for what it uses (resources, strategic-merge patches of maps, image
rewrites), so the test needs no kubectl; where kubectl is installed, its
`kubectl kustomize` output must be the same objects.
"""

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clusters.providers.kubernetes.manifests import from_dict, to_dict
from controlplane.env import parse_storage_root
from tests.deploy.test_deploy_manifests import MODELS, docs

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OVERLAY = DEPLOY / "overlays" / "eks"


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _key(doc):
    return doc["kind"], doc["metadata"]["name"]


def render(folder: Path) -> dict:
    """{(kind, name): object} of a kustomization folder."""
    (kustomization,) = docs(folder / "kustomization.yaml")
    found = {}
    for resource in kustomization.get("resources", []):
        path = (folder / resource).resolve()
        if path.is_dir():
            found.update(render(path))
        else:
            found.update({_key(d): d for d in docs(path)})
    for patch in kustomization.get("patches", []):
        for doc in docs(folder / patch["path"]):
            assert _key(doc) in found, f"{patch['path']} patches nothing: {_key(doc)}"
            _merge(found[_key(doc)], doc)
    for image in kustomization.get("images", []):
        for doc in found.values():
            for container in _containers(doc):
                name, _, _ = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = (f"{image.get('newName', name)}:"
                                          f"{image.get('newTag', 'latest')}")
    return found


def _containers(doc):
    template = (doc.get("spec") or {}).get("template") or {}
    return ((template.get("spec") or {}).get("containers")) or []


@pytest.fixture(scope="module")
def rendered():
    return render(OVERLAY)


def test_the_overlay_renders_valid_objects(rendered):
    for (kind, name), doc in rendered.items():
        assert to_dict(from_dict(doc, MODELS[kind])) == doc, (kind, name)


def test_checkpoints_default_to_an_s3_root(rendered):
    data = rendered[("ConfigMap", "regatta-config")]["data"]
    first = data["REGATTA_STORAGE_ROOTS"].split(",")[0]
    assert first.startswith("s3://")
    assert parse_storage_root(first)  # what the control plane will accept at start
    assert data["AWS_DEFAULT_REGION"]
    assert data["REGATTA_PUBLIC_URL"]  # the base's keys are kept


def test_the_trainer_has_an_irsa_role_and_no_kubernetes_token(rendered):
    trainer = rendered[("ServiceAccount", "regatta-trainer")]
    assert trainer["metadata"]["namespace"] == "regatta-training"
    assert trainer["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
        "arn:aws:iam::")
    assert trainer["automountServiceAccountToken"] is False
    bound = {s["name"] for (kind, _), d in rendered.items() if kind.endswith("Binding")
             for s in d["subjects"]}
    assert "regatta-trainer" not in bound


def test_the_control_plane_reaches_aws_through_irsa(rendered):
    account = rendered[("ServiceAccount", "regatta-control-plane")]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(
        ":role/regatta-control-plane")
    assert account["metadata"]["labels"] == {"app.kubernetes.io/part-of": "regatta"}


def test_every_process_runs_the_ecr_image(rendered):
    images = {c["image"] for d in rendered.values() for c in _containers(d)}
    assert images == {"123456789012.dkr.ecr.us-east-1.amazonaws.com/regatta/control-plane:0.1.0"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same_objects(rendered):
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    theirs = {_key(d): d for d in yaml.safe_load_all(out) if d}
    assert theirs == rendered
