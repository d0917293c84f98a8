"""Which GPUs the local fleet's logical nodes see (clusters/providers/local/devices.py).

There is no GPU here. The machine's GPUs come from the worker's
CUDA_VISIBLE_DEVICES, as an operator would pin them, or, in one test, from a
stand-in `nvidia-smi` script on PATH that prints two indices; the ranks are
real torchrun processes whose environment is read back."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from clusters.models import Cluster, NodePool
from clusters.providers.local.devices import gang_devices, machine_gpus
from clusters.providers.local.provider import LocalPoolSettings
from controlplane.lib.errors import PermanentError
from tests.support.local_fleet import fleet, make_pool, request, wait_done

__all__ = ["fleet"]


def _nodes(*names, **held):
    return {n: {"name": n, "gpus": held.get(n.replace("-", "_"))} for n in names}


def test_a_cpu_pool_hides_every_gpu_whatever_the_machine_has(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gang_devices({}, ["a", "b"], "cpu", 1, "lab/a") == {
        "a": {"CUDA_VISIBLE_DEVICES": ""}, "b": {"CUDA_VISIBLE_DEVICES": ""}}


def test_each_node_of_a_cuda_gang_takes_gpus_of_its_own_and_keeps_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    nodes = _nodes("a", "b", "c")
    assert gang_devices(nodes, ["a", "b"], "cuda", 2, "lab/a") == {
        "a": {"CUDA_VISIBLE_DEVICES": "0,1"}, "b": {"CUDA_VISIBLE_DEVICES": "2,3"}}
    assert nodes["a"]["gpus"] == ["0", "1"] and nodes["c"]["gpus"] is None
    # A relaunch of the same gang in the other order: each keeps its own.
    assert gang_devices(nodes, ["b", "a"], "cuda", 2, "lab/a")["a"] == {
        "CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_replacement_takes_the_gpus_its_retired_node_freed(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    nodes = _nodes("a", "b")
    gang_devices(nodes, ["a"], "cuda", 1, "lab/a")
    gang_devices(nodes, ["b"], "cuda", 1, "lab/a")
    assert (nodes["a"]["gpus"], nodes["b"]["gpus"]) == (["0"], ["1"])
    # `a` is retired (the caller leaves retired nodes out); the spare `s` takes GPU 0.
    live = {"b": nodes["b"], "s": {"name": "s"}}
    assert gang_devices(live, ["s"], "cuda", 1, "lab/a") == {"s": {"CUDA_VISIBLE_DEVICES": "0"}}


def test_past_the_free_gpus_a_node_shares_the_least_held_but_never_within_its_gang(
        monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    nodes = _nodes("a", "b", "c", "d")
    gang_devices(nodes, ["a", "b"], "cuda", 1, "lab/a")
    # One GPU each is taken; a one-node job elsewhere shares GPU 0 (CUDA allows it).
    assert gang_devices(nodes, ["c"], "cuda", 1, "lab/a") == {"c": {"CUDA_VISIBLE_DEVICES": "0"}}
    # c and d together: d avoids c's GPU, sharing GPU 1 with b instead.
    nodes["c"]["gpus"] = ["0"]
    assert gang_devices(nodes, ["c", "d"], "cuda", 1, "lab/a")["d"] == {
        "CUDA_VISIBLE_DEVICES": "1"}


def test_a_gang_that_would_put_two_ranks_on_one_gpu_is_refused_naming_them(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(PermanentError, match=r"lab/a: nodes a and b of this gang would share "
                                             r"GPU 0.*1 GPU\(s\) for 2 node\(s\) x 1"):
        gang_devices(_nodes("a", "b"), ["a", "b"], "cuda", 1, "lab/a")


@pytest.mark.parametrize("visible", ["", "-1"])
def test_a_cuda_pool_on_a_machine_without_gpus_says_what_to_change(monkeypatch, visible):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(PermanentError, match=r"lab/a: its nodes each need 1 GPU\(s\) \(devices:"
                                             r" cuda\) and this machine shows 0; set the pool's"
                                             r" devices to cpu"):
        gang_devices(_nodes("a"), ["a"], "cuda", 1, "lab/a")


def test_without_cuda_visible_devices_the_gpus_are_nvidia_smis_in_pci_bus_order(
        monkeypatch, tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=index ] && printf '0\\n1\\n'\n")
    smi.chmod(0o755)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert machine_gpus() == (["0", "1"], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert gang_devices(_nodes("a"), ["a"], "cuda", 1, "lab/a") == {
        "a": {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}


def test_without_nvidia_smi_the_machine_has_no_gpu(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert machine_gpus() == ([], {})


@pytest.mark.django_db
def test_a_pool_with_an_unknown_devices_value_is_refused_naming_the_key():
    cluster = Cluster.objects.create(name="lab", provider=Cluster.Provider.LOCAL)
    pool = NodePool(cluster=cluster, name="a", instance_type="local-gpu", gpus_per_node=1,
                    settings={"devices": "tpu"})
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert refused.value.message_dict["settings"] == [
        "devices: is 'tpu'; one of ('cpu', 'cuda')"]
    pool.settings = {"devices": "cuda"}
    pool.full_clean()
    assert pool.config == LocalPoolSettings(devices="cuda")
    assert NodePool(cluster=cluster, name="b").config.devices == "cpu"


def _rank_env(ref: dict, node_rank: int) -> dict:
    path = Path(ref["dir"]) / f"node-{node_rank}" / "status" / f"env-{node_rank}.json"
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_ranks_of_a_cuda_pool_see_their_nodes_gpus_and_of_a_cpu_pool_none(
        fleet, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpu = dataclasses.replace(make_pool(), settings=LocalPoolSettings(devices="cuda"))
    ref = fleet.launch(request(fleet, gpu, "job-1-a1", env={"REGATTA_TEST_DUMP_ENV": "1"}))
    assert wait_done(fleet, ref).state == "succeeded"
    assert [_rank_env(ref, r)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["0", "1"]
    labels = {n.name: n.labels.get("regatta/gpus") for n in fleet.list_nodes(gpu)}
    assert labels == {"lab-a-0": "0", "lab-a-1": "1", "lab-a-2": None}

    cpu = make_pool(name="b")
    ref = fleet.launch(request(fleet, cpu, "job-2-a1", env={"REGATTA_TEST_DUMP_ENV": "1"}))
    assert wait_done(fleet, ref).state == "succeeded"
    assert [_rank_env(ref, r)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["", ""]
