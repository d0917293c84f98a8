"""The local preflight's DCGM step (clusters/providers/local/preflight.py):
DCGM speaks about a node's GPUs only where DCGM runs and the node has GPUs.
A machine with `dcgmi` on its PATH but no DCGM host engine (nv-hostengine)
answered every diagnostic with a connection error, which failed every node
of every check: each spare was cordoned as it joined, the job's node at its
launch, and the job waited in the queue for ever. Real torchrun all-reduces;
`dcgmi` is a stand-in script on the PATH (there is no DCGM on this machine),
printing what the real one prints."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool
from clusters.providers import get_provider
from clusters.providers.base import Placement, PoolInfo
from clusters.providers.local import LocalProvider
from clusters.providers.local.provider import LocalPoolSettings
from clusters.reconcile import reconcile_cluster_unlocked
from tests.support.local_fleet import kill_everything

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

NO_HOST_ENGINE = """\
Error: unable to establish a connection to the specified host: localhost
Error: Unable to connect to host engine. Host engine connection invalid/disconnected.
"""
DIAG_FAILED = """\
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
| Deployment                | Fail                                           |
+---------------------------+------------------------------------------------+
"""


def stand_in_dcgmi(folder: Path, output: str, code: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "dcgmi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def dcgmi(monkeypatch, tmp_path):
    folder = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return lambda output, code: stand_in_dcgmi(folder, output, code)


@pytest.mark.django_db
def test_a_machine_without_a_dcgm_host_engine_fails_no_spare_and_checks_each_once(
        dcgmi, tmp_path, settings):
    dcgmi(NO_HOST_ENGINE, 255)
    cluster = Cluster.objects.create(
        name="lab", provider=Cluster.Provider.LOCAL,
        settings={"fleet_dir": str(tmp_path / "fleet"), "preflight_timeout_s": 90.0})
    NodePool.objects.create(cluster=cluster, name="gpu", gpus_per_node=1, size=1, spare_count=1,
                            settings={"devices": "cuda"})
    now = timezone.now()
    try:
        reconcile_cluster_unlocked(cluster.id, now)
        reconcile_cluster_unlocked(cluster.id, now + timezone.timedelta(seconds=10))
    finally:
        kill_everything(get_provider(cluster).root)

    spare = Node.objects.get(cluster=cluster, is_spare=True)
    assert spare.state == Node.State.READY and spare.preflight_passed_at == now
    assert Node.objects.filter(cluster=cluster).count() == 2  # no spare cordoned, none added
    check = spare.events.get(reason="passed its preflight check on joining").evidence
    assert check["preflight"]["ok"] is True


def one_node(provider: LocalProvider, devices: str):
    pool = PoolInfo(cluster="lab", name=devices, instance_type="local", gpus_per_node=1,
                    size=1, settings=LocalPoolSettings(devices=devices))
    node = provider.list_nodes(pool)[0].name
    return pool, node, (Placement(node=node, node_rank=0),)


def test_a_failed_dcgm_diagnostic_fails_a_cuda_pools_node_and_says_nothing_of_a_cpu_pools(
        dcgmi, tmp_path):
    dcgmi(DIAG_FAILED, 226)
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab")
    try:
        pool, node, placements = one_node(provider, "cuda")
        gpu = provider.preflight(pool, placements, timeout_s=60)
        pool, node_cpu, placements = one_node(provider, "cpu")
        cpu = provider.preflight(pool, placements, timeout_s=60)
    finally:
        kill_everything(provider.root)

    assert not gpu.ok and gpu.failed_nodes == (node,)
    assert gpu.node_check(node)["check"] == "dcgm"
    assert "Deployment" in gpu.evidence["dcgm"]["summary"]
    assert cpu.ok, cpu.message
    assert cpu.evidence["dcgm"].startswith("not run")


def test_a_node_that_fails_its_check_carries_its_own_log_in_the_evidence(tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab")
    try:
        pool, node, placements = one_node(provider, "cpu")
        provider.inject_fault(pool, node, "preflight_fail")
        result = provider.preflight(pool, placements, timeout_s=60)
    finally:
        kill_everything(provider.root)

    assert not result.ok
    assert "failed its self-test: simulated hardware fault" in result.node_check(node)["log_tail"]
