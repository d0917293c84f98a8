"""The PyTorchJob, Secret and preflight manifests, built by pure functions.

These tests check the manifests themselves and their round trip through the
official `kubernetes` and `kubeflow-training` models;
test_kubernetes_provider.py sends them to the real API server of
tests/support/kube_cluster.py.
"""

import json
import os
import socket
import subprocess
import sys

import pytest
from kubeflow.training import models as kf

from clusters.providers.base import LaunchRequest, Placement, PoolInfo
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes.config import KubeSettings
from clusters.settings import parse_pool
from controlplane.lib.errors import PermanentError

TOKEN = "rgw_7_secret-token-value"


def make_pool(**kw):
    base = dict(cluster="eks-a", name="h100", instance_type="p5.48xlarge", gpus_per_node=8,
                node_selector={"eks.amazonaws.com/nodegroup": "h100"},
                tolerations=[{"key": "dedicated", "operator": "Equal", "value": "training",
                              "effect": "NoSchedule"}])
    base.update(kw)
    base["settings"] = parse_pool(base.get("settings"), "kubernetes")
    return PoolInfo(**base)


def make_request(nodes=("ip-10-0-0-1", "ip-10-0-0-2", "ip-10-0-0-3"), pool=None, **kw):
    base = dict(
        job_id=7, attempt_id=21, attempt_number=2, name="job-7-a2", pool=pool or make_pool(),
        placements=tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes)),
        nproc_per_node=8, image="registry.example/regatta/trainer:1.0",
        env={"REGATTA_URL": "https://regatta.example", "REGATTA_TOKEN": TOKEN,
             "REGATTA_JOB_ID": "7", "REGATTA_ATTEMPT_ID": "21", "REGATTA_RESUME_STEP": "400",
             "REGATTA_STATUS_DIR": "/tmp/status", "REGATTA_NODE": "ignored"},
        checkpoint_uri="s3://ckpts/runs/job-7",
    )
    base.update(kw)
    return LaunchRequest(**base)


def round_trip(model, klass):
    data = mf.to_dict(model)
    back = mf.from_dict(data, klass)
    assert back == model
    assert mf.to_dict(back) == data
    return data


def container(job: dict, replica: str) -> dict:
    return job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def pod_spec(job: dict, replica: str) -> dict:
    return job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]


def env_of(job: dict, replica: str = "Master") -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(job, replica)["env"]}


@pytest.mark.parametrize("raw", [
    {},
    {"gang_scheduler": "volcano", "queue": "training", "priority_class": "high"},
    {"gang_scheduler": "kueue", "queue": "team-a", "shm_size": "64Gi",
     "service_account": "trainer", "image_pull_secrets": ["ecr"]},
])
def test_every_manifest_round_trips_through_the_official_models(raw):
    settings = KubeSettings.parse(raw)
    request = make_request(pool=make_pool(efa=True, settings={"efa_devices": 32}))
    job = round_trip(mf.pytorch_job(request, settings), "KubeflowOrgV1PyTorchJob")
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    round_trip(mf.token_secret(request, settings), "V1Secret")
    round_trip(mf.preflight_job(request.pool, request.placements, settings, nonce="n1"),
               "KubeflowOrgV1PyTorchJob")
    owner = {"metadata": {"name": "job-7-a2", "uid": "0d5c-uid"}}
    round_trip(mf.owner_reference(owner), "V1OwnerReference")


def test_a_job_with_its_checkpoint_volume_round_trips_through_the_official_models():
    settings = KubeSettings.parse({"checkpoint_pvc": "fsx-lustre", "checkpoint_mount_path": "/fsx",
                                   "shm_size": "64Gi"})
    request = make_request(checkpoint_uri="file:///fsx/regatta/job-7")
    job = round_trip(mf.pytorch_job(request, settings), "KubeflowOrgV1PyTorchJob")
    model = mf.from_dict(job, "KubeflowOrgV1PyTorchJob")
    spec = model.spec.pytorch_replica_specs["Worker"].template.spec
    claim = next(v for v in spec.volumes if v.name == "checkpoints").persistent_volume_claim
    assert claim.claim_name == "fsx-lustre"
    assert {(m.name, m.mount_path, m.sub_path) for m in spec.containers[0].volume_mounts} == {
        ("checkpoints", "/fsx/regatta/job-7", "regatta/job-7"), ("dshm", "/dev/shm", None)}


def test_the_eviction_round_trips_through_the_official_models():
    data = round_trip(mf.eviction("job-7-a2-worker-0", "team-a", 120), "V1Eviction")
    assert data == {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": "job-7-a2-worker-0", "namespace": "team-a"},
                    "deleteOptions": {"gracePeriodSeconds": 120}}


def test_it_builds_a_master_and_workers_pinned_one_per_chosen_node():
    job = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings()))
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    assert job["spec"]["nprocPerNode"] == "8"

    def pinned(replica):
        terms = pod_spec(job, replica)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = terms[0]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/hostname" and expr["operator"] == "In"
        return expr["values"]

    assert pinned("Master") == ["ip-10-0-0-1"]
    assert pinned("Worker") == ["ip-10-0-0-2", "ip-10-0-0-3"]
    apart = pod_spec(job, "Worker")["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert apart["topologyKey"] == "kubernetes.io/hostname"
    assert apart["labelSelector"]["matchLabels"] == {"training.kubeflow.org/job-name": "job-7-a2"}
    # Regatta owns restarts; the operator restarts nothing and keeps pods
    # (no backoffLimit: with one, the operator deletes the pods on a failure).
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "None"}
    assert specs["Worker"]["restartPolicy"] == "Never"
    assert pod_spec(job, "Worker")["restartPolicy"] == "Never"


def test_a_single_node_attempt_has_only_a_master():
    job = mf.to_dict(mf.pytorch_job(make_request(nodes=("n1",)), KubeSettings()))
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_it_requests_gpus_and_efa_devices_per_pod_with_the_pool_selectors():
    pool = make_pool(efa=True, settings={"efa_devices": 32})
    job = mf.to_dict(mf.pytorch_job(make_request(pool=pool), KubeSettings()))
    for replica in ("Master", "Worker"):
        resources = container(job, replica)["resources"]
        assert resources["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32",
                                       "cpu": "172800m", "memory": "1887436Mi"}
        assert resources["requests"] == resources["limits"]
        spec = pod_spec(job, replica)
        assert spec["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "h100"}
        assert {"key": "dedicated", "operator": "Equal", "value": "training",
                "effect": "NoSchedule"} in spec["tolerations"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists",
                "effect": "NoSchedule"} in spec["tolerations"]
    env = env_of(job)
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"

    plain = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings()))
    assert "vpc.amazonaws.com/efa" not in container(plain, "Master")["resources"]["limits"]
    assert "FI_PROVIDER" not in env_of(plain)


def test_the_token_comes_from_the_attempts_secret_never_the_manifest():
    request = make_request()
    settings = KubeSettings(namespace="team-a")
    job = mf.to_dict(mf.pytorch_job(request, settings))
    assert TOKEN not in repr(job)
    env = env_of(job)
    assert env["REGATTA_TOKEN"] == {"secretKeyRef": {"name": "job-7-a2-token", "key": "token"}}
    secret = mf.to_dict(mf.token_secret(request, settings))
    assert secret["metadata"]["name"] == "job-7-a2-token"
    assert secret["metadata"]["namespace"] == "team-a"
    assert secret["stringData"] == {"token": TOKEN}
    assert secret["metadata"]["labels"]["regatta.io/attempt-id"] == "21"


def test_a_request_without_a_token_is_refused():
    request = make_request(env={"REGATTA_URL": "https://regatta.example"})
    with pytest.raises(PermanentError, match="REGATTA_TOKEN"):
        mf.token_secret(request, KubeSettings())


def test_the_trainer_environment_follows_the_protocol():
    job = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings(region="us-east-1")))
    env = env_of(job, "Worker")
    assert env["REGATTA_URL"] == "https://regatta.example"
    assert env["REGATTA_JOB_ID"] == "7" and env["REGATTA_ATTEMPT_ID"] == "21"
    assert env["REGATTA_RESUME_STEP"] == "400"
    assert env["REGATTA_CHECKPOINT_URI"] == "s3://ckpts/runs/job-7"
    assert env["AWS_DEFAULT_REGION"] == "us-east-1"
    # The node name comes from the pod itself; a status folder would die with it.
    assert env["REGATTA_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "REGATTA_STATUS_DIR" not in env
    # torchrun waits the pod's whole grace period for an emergency checkpoint.
    assert container(job, "Worker")["command"] == ["torchrun", "--shutdown-timeout=120",
                                                   "--module", "--", "trainer"]
    assert container(job, "Worker")["name"] == "pytorch"
    custom = mf.to_dict(mf.pytorch_job(make_request(command=("/app/train.py", "--lr", "3e-4")),
                                       KubeSettings()))
    assert container(custom, "Master")["command"] == [
        "torchrun", "--shutdown-timeout=120", "--", "/app/train.py", "--lr", "3e-4"]


def test_nccl_settings_layer_defaults_then_cluster_then_pool():
    settings = KubeSettings.parse({"nccl_env": {"NCCL_SOCKET_IFNAME": "eth0",
                                                "NCCL_DEBUG": "INFO"}})
    pool = make_pool(settings={"nccl_env": {"NCCL_SOCKET_IFNAME": "ens5", "NCCL_IB_DISABLE": 1}})
    env = env_of(mf.to_dict(mf.pytorch_job(make_request(pool=pool), settings)))
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env_of(mf.to_dict(mf.pytorch_job(make_request(), KubeSettings())))[
        "NCCL_DEBUG"] == "WARN"


def test_volcano_gets_its_scheduler_and_a_gang_of_every_node():
    settings = KubeSettings.parse({"gang_scheduler": "volcano", "queue": "training"})
    job = mf.to_dict(mf.pytorch_job(make_request(), settings))
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3,
                                                            "queue": "training"}
    assert pod_spec(job, "Master")["schedulerName"] == "volcano"
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]


def test_kueue_admits_through_its_queue_label():
    settings = KubeSettings.parse({"gang_scheduler": "kueue", "queue": "team-a"})
    job = mf.to_dict(mf.pytorch_job(make_request(), settings))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    assert "schedulerName" not in pod_spec(job, "Master")


def test_path_checkpoints_mount_only_the_job_s_folder_of_the_shared_volume():
    """Not the whole volume: every team's checkpoints live on it."""
    settings = KubeSettings.parse({"checkpoint_pvc": "fsx-lustre",
                                   "checkpoint_mount_path": "/fsx"})
    request = make_request(checkpoint_uri="file:///fsx/ckpt/vision/job-7/")
    job = mf.to_dict(mf.pytorch_job(request, settings))
    spec = pod_spec(job, "Worker")
    assert spec["volumes"] == [{"name": "checkpoints",
                                "persistentVolumeClaim": {"claimName": "fsx-lustre"}}]
    for role in ("Master", "Worker"):
        assert container(job, role)["volumeMounts"] == [{
            "name": "checkpoints", "mountPath": "/fsx/ckpt/vision/job-7",
            "subPath": "ckpt/vision/job-7"}]
    assert env_of(job)["REGATTA_CHECKPOINT_URI"] == "/fsx/ckpt/vision/job-7/"


def test_s3_checkpoints_mount_nothing():
    job = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings(checkpoint_pvc="fsx")))
    assert "volumes" not in pod_spec(job, "Master")


def test_a_path_checkpoint_without_a_volume_is_refused():
    with pytest.raises(PermanentError, match="checkpoint_pvc"):
        mf.pytorch_job(make_request(checkpoint_uri="/var/lib/ckpt"), KubeSettings())
    for outside in ("/elsewhere/x", "/fsx", "/fsx/../etc", "/fsxother/x"):
        with pytest.raises(PermanentError, match="not a folder inside"):
            mf.pytorch_job(make_request(checkpoint_uri=outside),
                           KubeSettings(checkpoint_pvc="fsx", checkpoint_mount_path="/fsx"))


def test_the_preflight_runs_one_pod_per_node_and_expires():
    request = make_request()
    settings = KubeSettings(preflight_image="registry.example/regatta/trainer:1.0")
    job = mf.to_dict(mf.preflight_job(request.pool, request.placements, settings, nonce="a"))
    assert job["spec"]["nprocPerNode"] == "1"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert job["metadata"]["labels"]["regatta.io/purpose"] == "preflight"
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 300
    assert container(job, "Master")["command"][:2] == ["python", "-c"]
    assert container(job, "Master")["image"] == "registry.example/regatta/trainer:1.0"
    again = mf.preflight_job(request.pool, request.placements, settings, nonce="b")
    assert again.metadata.name != job["metadata"]["name"]
    assert len(again.metadata.name) <= 63


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_preflight_script_all_reduces_across_real_processes():
    """Two processes with the environment the training operator gives each pod
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); gloo on CPU here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", mf.PREFLIGHT_SCRIPT], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=100)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    reports = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["ok"] and r["busbw_gbps"] > 0 for r in reports)


@pytest.mark.parametrize("raw, key", [
    ({"preflight": "nccl-tests"}, "preflight"),
    ({"gang_scheduler": "yunikorn"}, "gang_scheduler"),
    ({"gang_scheduler": "volcano"}, "queue"),
    ({"namespace": 3}, "namespace"),
    ({"in_cluster": "yes"}, "in_cluster"),
    ({"termination_grace_s": -1}, "termination_grace_s"),
    ({"termination_grace_s": 90.5}, "termination_grace_s"),
    ({"termination_grace_s": True}, "termination_grace_s"),
    ({"request_timeout_s": "soon"}, "request_timeout_s"),
    ({"nccl_env": ["NCCL_DEBUG=INFO"]}, "nccl_env"),
    ({"delete_propagation": "Orphan"}, "delete_propagation"),
])
def test_a_bad_cluster_setting_is_a_permanent_error_naming_it(raw, key):
    with pytest.raises(PermanentError, match=key):
        KubeSettings.parse(raw)


def test_the_grace_period_goes_into_the_pods_as_a_whole_number():
    settings = KubeSettings.parse({"termination_grace_s": 300, "request_timeout_s": 2.5})
    job = mf.to_dict(mf.pytorch_job(make_request(), settings))
    assert pod_spec(job, "Master")["terminationGracePeriodSeconds"] == 300
    assert settings.request_timeout_s == 2.5
    with pytest.raises(PermanentError, match="whole number of seconds"):
        KubeSettings.parse({"termination_grace_s": 120.0})


def test_preflight_on_or_off_is_read_as_the_job_reconciler_reads_it():
    """jobs/context.py reads `preflight` as true/false; false must not
    make the cluster's settings unreadable."""
    assert KubeSettings.parse({"preflight": False}).preflight == "allreduce"
    assert KubeSettings.parse({"preflight": True}).preflight == "allreduce"
    assert KubeSettings.parse({"preflight": "dcgm-labels"}).preflight == "dcgm-labels"


def test_settings_of_other_adapters_are_left_alone():
    settings = KubeSettings.parse({"asg_name": "x", "endpoint_url": "http://aws", "region": "r"})
    assert settings.namespace == "regatta-training" and settings.region == "r"


def test_a_bad_toleration_is_a_permanent_error():
    pool = make_pool(tolerations=[{"key": "a", "tolerationSeconds": "soon"}])
    with pytest.raises(PermanentError, match="toleration"):
        mf.pytorch_job(make_request(pool=pool), KubeSettings())


def test_kubeflow_models_are_what_is_built():
    assert isinstance(mf.pytorch_job(make_request(), KubeSettings()), kf.KubeflowOrgV1PyTorchJob)


# --- QoS, disruption and EFA defaults ------------------------------------------

def resources_of(pool, allocatable=None):
    job = mf.to_dict(mf.pytorch_job(make_request(pool=pool), KubeSettings(), allocatable))
    return container(job, "Master")["resources"]


def test_pods_are_guaranteed_qos_sized_from_the_placed_nodes_allocatable():
    resources = resources_of(make_pool(), {"cpu": "191", "memory": "2000Gi", "gpus": "8"})
    # All 8 GPUs of the node: its allocatable less a tenth for its DaemonSets,
    # 1,843,200 MiB written as Go's resource.Quantity writes it, so that a
    # controller round-tripping the object through Go's types sends back
    # the same string (Kueue updating a TrainJob, whose trainer spec is
    # immutable: test_kubernetes_kueue.py).
    assert resources["limits"] == {"nvidia.com/gpu": "8", "cpu": "171900m",
                                   "memory": "1800Gi"}
    assert resources["requests"] == resources["limits"]


def test_a_pool_may_set_cpu_and_memory_per_gpu_or_turn_qos_off():
    pool = make_pool(gpus_per_node=4, settings={"cpu_per_gpu": "22", "memory_per_gpu": "230Gi"})
    assert resources_of(pool)["limits"] == {"nvidia.com/gpu": "4", "cpu": "88",
                                            "memory": "920Gi"}
    off = make_pool(settings={"guaranteed_qos": False})
    assert resources_of(off)["limits"] == {"nvidia.com/gpu": "8"}
    # An instance type Regatta does not know, and no node read: GPUs only.
    assert resources_of(make_pool(instance_type="x9.huge"))["limits"] == {"nvidia.com/gpu": "8"}


def test_a_bad_quantity_is_a_permanent_error_naming_the_key():
    pool = make_pool(settings={"cpu_per_gpu": "lots", "memory_per_gpu": "1Gi"})
    with pytest.raises(PermanentError, match="cpu_per_gpu"):
        mf.pytorch_job(make_request(pool=pool), KubeSettings())


def test_training_pods_ask_node_autoscalers_not_to_disrupt_them():
    job = mf.to_dict(mf.pytorch_job(make_request(), KubeSettings()))
    for replica in ("Master", "Worker"):
        meta = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["metadata"]
        assert meta["annotations"] == {"karpenter.sh/do-not-disrupt": "true",
                                       "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


@pytest.mark.parametrize("instance_type,settings,expected", [
    ("p5.48xlarge", {}, "32"),
    ("p5en.48xlarge", {}, "16"),
    ("p4d.24xlarge", {}, "4"),
    ("g5.48xlarge", {}, "1"),
    ("x9.huge", {}, "1"),
    ("p5.48xlarge", {"efa_devices": 8}, "8"),
])
def test_efa_devices_default_to_the_instance_types_count(instance_type, settings, expected):
    pool = make_pool(instance_type=instance_type, efa=True, settings=settings)
    assert resources_of(pool)["limits"]["vpc.amazonaws.com/efa"] == expected
