"""A job's env holds only the names teams need for their program's own
libraries (jobs/isolation.py, TEAM_ENV, the table in docs/byo.md); any other
name, and so every one that changes a rank's isolation, is refused with a
400 naming it unless the cluster's env_allow setting lets it; a cluster with
an image_allow list runs only images from there."""

import re
from pathlib import Path

import pytest

from jobs.isolation import TEAM_ENV
from jobs.models import TrainingJob

from .test_api_submit import URL, messages, spec

PROGRAM = ["/opt/code/train_ddp.py"]

pytestmark = pytest.mark.django_db


def submit(api, owner, **fields):
    return api(owner).post(URL, spec(entrypoint=PROGRAM, **fields), format="json")


@pytest.mark.parametrize("name", [
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH",
    "LD_AUDIT", "PET_NNODES", "PET_RDZV_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "KUBERNETES_SERVICE_HOST",
    # Names a denylist let through: the module path, the loader's, proxies,
    # how GPUs are numbered, the container runtime's, other vendors' GPUs,
    # the fabric.
    "PYTHONPATH", "PATH", "GCONV_PATH", "GLIBC_TUNABLES", "HTTPS_PROXY", "https_proxy",
    "CUDA_DEVICE_ORDER", "NVIDIA_DRIVER_CAPABILITIES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "NCCL_NET_PLUGIN", "NCCL_IB_HCA",
    "PYTHONSTARTUP", "PYTHONHOME", "TMPDIR", "MY_SETTING",
])
def test_a_name_that_changes_isolation_is_a_400_naming_it(api, owner, cluster, name):
    resp = submit(api, owner, env={"NCCL_DEBUG": "INFO", name: "x"})
    assert resp.status_code == 400, resp.data
    [message] = messages(resp.data["env"])
    assert message.startswith(f"{name}:") and "env_allow" in message
    assert not TrainingJob.objects.exists()


def test_the_names_teams_need_pass_without_the_operator(api, owner, cluster):
    env = {"HF_HOME": "/cache/hf", "HF_TOKEN": "hf_x", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "TORCH_LOGS": "+dynamo",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "OMP_NUM_THREADS": "1",
           "NCCL_DEBUG": "INFO", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TRITON_CACHE_DIR": "/tmp/t", "TZ": "UTC"}
    resp = submit(api, owner, env=env)
    assert resp.status_code == 201, resp.data
    assert TrainingJob.objects.get().env == env


def test_the_table_in_the_docs_is_the_one_the_code_reads():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "byo.md").read_text()
    section = doc.split("### The environment a job may set", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([A-Z0-9_*]+)` \| (.+) \|$", section, re.MULTILINE)
    assert rows == list(TEAM_ENV)


def test_an_operator_may_allow_a_prefix_beyond_the_table(api, owner, cluster):
    cluster.settings = {"env_allow": ["NCCL_*", "HTTPS_PROXY"]}
    cluster.save()
    resp = submit(api, owner, env={"NCCL_SOCKET_IFNAME": "eth0", "HTTPS_PROXY": "http://p:3128"})
    assert resp.status_code == 201, resp.data
    resp = submit(api, owner, name="other", env={"PYTHONPATH": "/opt/code"})
    assert resp.status_code == 400 and "PYTHONPATH" in messages(resp.data["env"])[0]


def test_every_refused_name_is_named_in_one_reply(api, owner, cluster):
    resp = submit(api, owner, env={"LD_PRELOAD": "/x.so", "AWS_PROFILE": "prod"})
    assert [m.split(":")[0] for m in messages(resp.data["env"])] == ["AWS_PROFILE",
                                                                     "LD_PRELOAD"]


def test_an_operator_allows_names_and_prefixes_per_cluster(api, owner, cluster):
    cluster.settings = {"env_allow": ["LD_LIBRARY_PATH", "AWS_*"]}
    cluster.save()
    resp = submit(api, owner, env={"LD_LIBRARY_PATH": "/opt/lib", "AWS_REGION": "eu-west-1"})
    assert resp.status_code == 201, resp.data
    resp = submit(api, owner, name="preload", env={"LD_PRELOAD": "/x.so"})
    assert resp.status_code == 400 and "LD_PRELOAD" in messages(resp.data["env"])[0]


@pytest.mark.parametrize(("image", "ok"), [
    ("registry.example.com/ml/trainer:1.2", True),
    ("registry.example.com/ml/trainer@sha256:" + "a" * 64, True),
    ("ghcr.io/regatta/worker:3", True),
    ("ghcr.io/regatta:3", False),  # not under the repository prefix
    ("registry.example.com.evil.io/ml/trainer:1", False),
    ("docker.io/library/ubuntu:24.04", False),
    ("ubuntu", False),
])
def test_a_cluster_with_an_image_allow_list_runs_only_images_from_it(api, owner, cluster,
                                                                      image, ok):
    cluster.settings = {"image_allow": ["registry.example.com", "ghcr.io/regatta/"]}
    cluster.save()
    resp = submit(api, owner, image=image)
    assert (resp.status_code == 201) == ok, resp.data
    if not ok:
        assert "image_allow" not in resp.data and "allows" in messages(resp.data["image"])[0]
        assert not TrainingJob.objects.exists()


def test_a_cluster_without_an_image_allow_list_runs_any_image(api, owner, cluster):
    assert submit(api, owner, image="docker.io/library/ubuntu:24.04").status_code == 201


def test_a_bad_allow_setting_is_refused_when_the_cluster_is_saved(cluster):
    from django.core.exceptions import ValidationError

    cluster.settings = {"env_allow": "AWS_*"}
    with pytest.raises(ValidationError, match="env_allow"):
        cluster.full_clean()
