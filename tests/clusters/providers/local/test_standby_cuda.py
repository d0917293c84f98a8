"""A warm standby forks its node's ranks (regatta/node/standby.py), and a process that
initialised CUDA cannot hand it to the children it forks. So nothing in the
standby, nor in torchrun's agent forked from it, may touch CUDA before the
ranks are forked: a tripwire on CUDA's entry points (tests/support/
cuda_tripwire) records every call in every process of a warm launch, real
torchrun and ranks throughout. And the GPUs a `cuda` pool's node takes at
the launch reach its forked ranks where CUDA reads them (the C
environment), though the standby was born before the launch chose them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from regatta.node import standby

from clusters.providers.base import PoolInfo
from clusters.providers.local import LocalProvider
from clusters.providers.local.provider import LocalPoolSettings
from tests.support.local_fleet import kill_everything, request, wait_done, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRIPWIRE = Path(__file__).resolve().parents[3] / "support" / "cuda_tripwire"


@pytest.fixture
def calls(monkeypatch, tmp_path) -> Path:
    folder = tmp_path / "tripwire"
    shutil.copytree(TRIPWIRE, folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p))
    # This machine's GPUs as the worker sees them, when the standbys are born.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    return folder / "calls.jsonl"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_nothing_touches_cuda_before_the_fork_and_each_forked_rank_sees_its_nodes_gpus(
        calls, tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    pool = PoolInfo(cluster="lab", name="gpu", instance_type="local-gpu", gpus_per_node=1,
                    size=2, settings=LocalPoolSettings(devices="cuda"))
    try:
        nodes = [n.name for n in provider.list_nodes(pool)]
        provider.hold_spares(pool, nodes)
        wait_ready(provider, nodes)
        ref = provider.launch(request(provider, pool, "warm-cuda",
                                      env={"REGATTA_TEST_CUDA": "1"}))
        assert [n["warm"] for n in ref["nodes"]] == [True, True]
        assert wait_done(provider, ref).state == "succeeded"
    finally:
        kill_everything(provider.root)

    recorded = read(calls)
    outside_ranks = [c for c in recorded if c["rank"] is None]
    assert outside_ranks == [], json.dumps(outside_ranks, indent=1)
    # The tripwire works: the ranks' own first CUDA call was seen.
    assert {c["rank"] for c in recorded
            if c["what"] == "torch._C._cuda_getDeviceCount"} == {"0", "1"}
    for node_rank in (0, 1):
        seen = json.loads((Path(ref["dir"]) / f"node-{node_rank}" / "status"
                           / f"cuda-{node_rank}.json").read_text())
        assert seen["visible"] == seen["visible_to_cuda"] == str(node_rank), seen


MAPS = """\
7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 1234  /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 5678  /opt/torch/lib/libcudart.so.13
7f1c2c000000-7f1c2c800000 r-xp 00000000 08:01 9012  /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
7f1c2d000000-7f1c2d001000 rw-p 00000000 00:00 0
"""


def test_a_standby_that_loaded_the_cuda_driver_knows_it_and_refuses_gpu_launches(
        monkeypatch):
    """What a standby reads in its own /proc/self/maps once its imports are
    done (no CUDA driver on this machine: the maps text is a GPU machine's)."""
    assert standby.cuda_driver_loaded(MAPS).endswith("libcuda.so.580.159.04")
    assert standby.cuda_driver_loaded(MAPS.replace("libcuda.so", "libfoo.so")) == ""

    task = {"node_dir": "/x", "argv": [standby.sys.executable, "-m", "torch.distributed.run"],
            "env": {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHOME")
                    if k in os.environ}}
    assert standby._refusal({**task, "env": {**task["env"], "CUDA_VISIBLE_DEVICES": "0"}}) == ""
    monkeypatch.setattr(standby, "_CUDA_LOADED", "/usr/lib/libcuda.so.1")
    assert "CUDA was initialised here" in standby._refusal(
        {**task, "env": {**task["env"], "CUDA_VISIBLE_DEVICES": "0"}})
    # A cpu pool's ranks see no GPU: they never use CUDA, and may still fork.
    assert standby._refusal({**task, "env": {**task["env"], "CUDA_VISIBLE_DEVICES": ""}}) == ""
