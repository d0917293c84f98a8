"""The TrainJob an attempt becomes (job_api: trainjob) and the settings
that choose it, without a cluster; test_kubernetes_trainjob.py runs them
against the real Trainer v2 and JobSet controllers."""

from __future__ import annotations

import pytest

from clusters.providers.base import Placement
from clusters.providers.kubernetes import KubeSettings
from clusters.providers.kubernetes import manifests as mf
from clusters.providers.kubernetes import trainjob as tj
from controlplane.lib.typed_settings import SettingsError

from .test_manifests import make_pool, make_request


def test_it_makes_a_trainjob_of_the_pytorchjobs_pod():
    settings = KubeSettings.parse({"job_api": "trainjob", "preflight": "dcgm-labels",
                                   "gang_scheduler": "kueue", "queue": "training"})
    request = make_request()
    body = tj.train_job(request, settings)
    pytorch = mf.to_dict(mf.pytorch_job(request, settings))
    pod = pytorch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    (container,) = pod["spec"]["containers"]

    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert body["spec"]["runtimeRef"] == {"name": "regatta-torch-distributed",
                                          "apiGroup": "trainer.kubeflow.org",
                                          "kind": "ClusterTrainingRuntime"}
    trainer = body["spec"]["trainer"]
    # The same container as the PyTorchJob's: image, torchrun command, env
    # (the token by secretKeyRef), GPUs and Guaranteed QoS.
    assert trainer["image"] == container["image"]
    assert trainer["command"] == container["command"]
    assert trainer["env"] == container["env"]
    assert trainer["resourcesPerNode"] == container["resources"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 8
    (patch,) = body["spec"]["runtimePatches"]
    (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    template = replicated["template"]["spec"]["template"]
    assert template["metadata"] == pod["metadata"]
    spec = template["spec"]
    for key in ("nodeSelector", "tolerations", "terminationGracePeriodSeconds"):
        assert spec[key] == pod["spec"][key]
    # Any of the three chosen nodes, one pod each (kept apart by the JobSet's label).
    affinity = spec["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["ip-10-0-0-1", "ip-10-0-0-2",
                                                    "ip-10-0-0-3"]
    (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["labelSelector"]["matchLabels"] == {tj.JOBSET_NAME_LABEL: "job-7-a2"}


def test_the_checkpoint_volume_is_mounted_into_the_runtimes_trainer_container(tmp_path):
    settings = KubeSettings.parse({"job_api": "trainjob", "preflight": False,
                                   "checkpoint_pvc": "fsx", "checkpoint_mount_path": "/ckpt"})
    body = tj.train_job(make_request(checkpoint_uri="/ckpt/team/job-7"), settings)
    (patch,) = body["spec"]["runtimePatches"]
    spec = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert spec["volumes"] == [{"name": "checkpoints",
                                "persistentVolumeClaim": {"claimName": "fsx"}}]
    assert spec["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "checkpoints", "mountPath": "/ckpt/team/job-7", "subPath": "team/job-7"}]}]


def test_a_trainjob_cluster_refuses_what_a_trainjob_cannot_carry():
    with pytest.raises(SettingsError) as refused:
        KubeSettings.parse({"job_api": "trainjob", "priority_class": "high",
                            "gang_scheduler": "volcano", "queue": "q"})
    assert set(refused.value.problems) == {"priority_class", "gang_scheduler"}
    # The allreduce preflight runs as a TrainJob too: the default stays.
    assert KubeSettings.parse({"job_api": "trainjob"}).preflight == "allreduce"
    assert KubeSettings.parse({}).job_api == "pytorchjob"
    with pytest.raises(SettingsError):
        KubeSettings.parse({"job_api": "v3"})


def test_the_allreduce_preflight_is_a_trainjob_of_one_process_per_chosen_node():
    settings = KubeSettings.parse({"job_api": "trainjob", "gang_scheduler": "kueue",
                                   "queue": "training", "nccl_env": {"NCCL_DEBUG": "WARN"}})
    nodes = ("n0", "n1", "n2")
    job = tj.preflight_train_job(make_pool(), tuple(Placement(n, i) for i, n in enumerate(nodes)),
                                 settings, nonce="abc")
    assert job["metadata"]["name"].startswith("regatta-preflight-")
    assert job["metadata"]["labels"]["regatta.io/purpose"] == "preflight"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert job["spec"]["runtimeRef"]["name"] == settings.training_runtime
    assert job["spec"]["activeDeadlineSeconds"] == 300
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == 1
    # torchrun takes the rendezvous from the torch plugin's PET_* variables.
    assert trainer["command"][:4] == ["torchrun", "--no-python", "python", "-c"]
    assert trainer["command"][4] == mf.PREFLIGHT_SCRIPT
    assert trainer["env"] == [{"name": "NCCL_DEBUG", "value": "WARN"}]
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8"}
    (patch,) = job["spec"]["runtimePatches"]
    pod_spec = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    terms = pod_spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {v for t in terms for e in t["matchExpressions"] for v in e.get("values", [])
            if v in nodes} == set(nodes)


def pod(rank, node, phase="Running", exit_code=None, created="2026-01-01T00:00:00Z"):
    status = {"phase": phase}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "node", "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error"}}}]
    return {"metadata": {"name": f"p{rank}", "creationTimestamp": created,
                         "labels": {tj.COMPLETION_INDEX_LABEL: str(rank)}},
            "spec": {"nodeName": node}, "status": status}


TRAINJOB = {"kind": "TrainJob", "metadata": {"name": "job-7-a2"}, "status": {}}
PLACED = [{"node": "n0", "node_rank": 0}, {"node": "n1", "node_rank": 1}]


def jobset(**counts):
    return {"kind": "JobSet", "status": {"replicatedJobsStatus": [{"name": "node", **counts}]}}


def failed(obj):
    return {**obj, "status": {**obj.get("status", {}), "conditions": [
        {"type": "Failed", "status": "True", "message": "jobset failed"}]}}


def test_it_reads_each_rank_from_its_pods_index_on_the_node_it_runs_on():
    status = tj.attempt_status(TRAINJOB, jobset(active=1),
                               [pod(1, "n0"), pod(0, "n1")], PLACED)
    assert status.state == "running"
    assert {(n.node_rank, n.node, n.running) for n in status.nodes} == {
        (0, "n1", True), (1, "n0", True)}


def test_a_rank_removed_because_another_failed_is_not_blamed():
    status = tj.attempt_status(failed(TRAINJOB), failed(jobset(failed=1)),
                               [pod(1, "n1", phase="Failed", exit_code=1)], PLACED)
    assert status.state == "failed"
    (bad,) = status.failed_nodes
    assert bad.node == "n1" and bad.exit_code == 1
    assert "TrainJob Failed: jobset failed" in status.message


def test_a_pod_gone_from_a_started_gang_is_a_lost_rank_and_before_it_started_a_wait():
    started = tj.attempt_status(TRAINJOB, jobset(active=1), [pod(0, "n0")], PLACED)
    (lost,) = started.failed_nodes
    assert lost.node == "n1" and lost.signal == 9
    waiting = tj.attempt_status(TRAINJOB, None, [], PLACED)
    assert waiting.state == "running" and all(n.running for n in waiting.nodes)
    assert tj.attempt_status(None, None, [], PLACED).state == "unknown"
