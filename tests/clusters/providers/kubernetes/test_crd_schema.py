"""Every PyTorchJob Regatta generates validates against the training
operator's own CRD schema (kubeflow.org_pytorchjobs v1.9.0, read from the
shared data folder, never copied into the project).

No API server can run here, so `jsonschema` plays its validation; the
schema is made strict (no field it does not name), because the API server
silently prunes unknown fields of a structural schema: a misspelled field
would be dropped there, not rejected.
"""

from pathlib import Path

import jsonschema
import pytest
import yaml

from clusters.providers.base import Placement
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes.config import KubeSettings

from .test_manifests import make_pool, make_request

CRD = (Path(__file__).resolve().parents[5] / "shared" / "data" / "kubernetes"
       / "kubeflow.org_pytorchjobs-v1.9.0.yaml")
if not CRD.exists():  # a checkout beside /work/shared, or the shared folder itself
    CRD = Path("/work/shared/data/kubernetes/kubeflow.org_pytorchjobs-v1.9.0.yaml")


def strict(schema):
    """Forbid what the schema does not name, where the API server would prune it."""
    if isinstance(schema, dict):
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema = {**schema, "additionalProperties": False}
        return {k: strict(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validator():
    assert CRD.exists(), f"the training operator's CRD is expected at {CRD}"
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


SETTINGS = [
    {},
    {"gang_scheduler": "volcano", "queue": "training", "priority_class": "high"},
    {"gang_scheduler": "kueue", "queue": "team-a", "shm_size": "64Gi",
     "service_account": "trainer", "image_pull_secrets": ["ecr"]},
    {"checkpoint_pvc": "fsx", "checkpoint_mount_path": "/fsx"},
]
POOLS = [
    {},
    {"efa": True},
    {"efa": True, "instance_type": "p4d.24xlarge", "settings": {"efa_devices": 2}},
    {"settings": {"node_autoscaler": "karpenter"}},
    {"settings": {"guaranteed_qos": False}},
    {"settings": {"cpu_per_gpu": "22", "memory_per_gpu": "230Gi"}},
]


def errors(validator, body):
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(body)]


@pytest.mark.parametrize("raw", SETTINGS)
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("nodes", [("n1",), ("n1", "n2", "n3")])
def test_every_attempts_pytorchjob_validates_against_the_crd(validator, raw, pool, nodes):
    settings = KubeSettings.parse(raw)
    uri = "/fsx/runs/job-7" if raw.get("checkpoint_pvc") else "s3://ckpts/runs/job-7"
    request = make_request(nodes=nodes, pool=make_pool(**pool), checkpoint_uri=uri)
    body = mf.to_dict(mf.pytorch_job(request, settings, {"cpu": "191", "memory": "2000Gi",
                                                         "gpus": "8"}))
    assert errors(validator, body) == []
    assert mf.to_dict(mf.from_dict(body, "KubeflowOrgV1PyTorchJob")) == body


@pytest.mark.parametrize("raw", SETTINGS[:3])
def test_every_preflight_pytorchjob_validates_against_the_crd(validator, raw):
    placements = (Placement("n1", 0), Placement("n2", 1))
    body = mf.to_dict(mf.preflight_job(make_pool(efa=True), placements,
                                       KubeSettings.parse(raw), "nonce"))
    assert errors(validator, body) == []


def test_the_strict_schema_rejects_a_misspelled_field(validator):
    body = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings()))
    body["spec"]["runPolicy"]["backofLimit"] = 0
    assert any("backofLimit" in e for e in errors(validator, body))
