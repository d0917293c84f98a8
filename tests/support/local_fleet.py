"""Helpers for the local provider's tests (tests/clusters/providers/local/,
and the Slurm and job tests that run its rank program): a provider in a
temporary folder that kills everything it started when the test ends, small
requests, and a node's warm standby read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from regatta.node import procs, standby

from clusters.providers.base import LaunchRequest, Placement, PoolInfo
from clusters.providers.local import LocalProvider
from tests.support.waiting import eventually

RANKS_SCRIPT = str(Path(__file__).with_name("local_provider_ranks.py"))


def make_pool(size: int = 2, spare_count: int = 1, name: str = "a") -> PoolInfo:
    return PoolInfo(cluster="lab", name=name, instance_type="local-cpu", gpus_per_node=1,
                    size=size, spare_count=spare_count)


def request(provider: LocalProvider, pool: PoolInfo, name: str, nodes: int = 2,
            env: dict | None = None, command: tuple[str, ...] | None = None,
            nproc: int = 1) -> LaunchRequest:
    names = [n.name for n in provider.list_nodes(pool)][:nodes]
    return LaunchRequest(
        job_id=1, attempt_id=1, attempt_number=1, name=name, pool=pool,
        placements=tuple(Placement(node=n, node_rank=i) for i, n in enumerate(names)),
        nproc_per_node=nproc, image="local",
        command=(RANKS_SCRIPT,) if command is None else command,
        env={"REGATTA_TEST_STEPS": "3", **(env or {})},
    )


def kill_everything(root: Path) -> None:
    """Whatever a test started under `root`, however it went, dies here."""
    found = procs.scan(fleet=str(Path(root).resolve()))
    procs.kill_hard(found)
    procs.wait_gone(found, 10)


def wait_done(provider: LocalProvider, ref: dict, timeout: float = 90):
    return eventually(lambda: (s := provider.observe(ref)).state != "running" and s,
                      timeout=timeout, what="the attempt to end")


def progress(ref: dict, rank: int, node_rank: int) -> int:
    path = Path(ref["dir"]) / f"node-{node_rank}" / "status" / f"progress-{rank}"
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def info(provider: LocalProvider, node: str) -> dict:
    path = standby.standby_dir(provider.root, node) / standby.INFO
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def wait_ready(provider: LocalProvider, nodes: list[str]) -> None:
    eventually(lambda: all(info(provider, n).get("state") == "ready" for n in nodes),
               timeout=120, what=f"standbys ready on {nodes}")


def alive(pid: int) -> bool:
    return procs.is_running(pid)


@pytest.fixture
def fleet(tmp_path):
    """A local provider of cluster "lab" in a fresh folder; everything it
    started is killed afterwards, pass or fail."""
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab")
    try:
        yield provider
    finally:
        kill_everything(provider.root)
