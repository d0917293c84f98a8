"""The built-in trainer compiled (torch.compile, as it is on CUDA by
default) in a rank forked from a warm standby: its first step compiles
there (torch._inductor's compile workers are started from the forked rank)
and the run goes on to its end, its start-up markers saying where the first
step's time went. Real torchrun agent, gloo, CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters.providers.local import LocalProvider
from tests.support.local_fleet import kill_everything, make_pool, request, wait_done, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def test_a_compiled_trainer_forked_from_a_standby_compiles_its_first_step_and_finishes(
        tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    pool = make_pool(size=1, spare_count=0)
    config = {"model": "nano", "max_steps": 3, "batch_size": 8, "warmup_steps": 1,
              "log_every_steps": 1, "compile": True}
    try:
        node = provider.list_nodes(pool)[0].name
        provider.hold_spares(pool, [node])
        wait_ready(provider, [node])
        ref = provider.launch(request(provider, pool, "compiled", nodes=1, command=(), env={
            "REGATTA_CONFIG": json.dumps(config),
            "REGATTA_CHECKPOINT_URI": str(tmp_path / "ckpt")}))
        assert [n["warm"] for n in ref["nodes"]] == [True]
        status = wait_done(provider, ref, timeout=400)
    finally:
        kill_everything(provider.root)

    assert status.state == "succeeded", status.nodes[0].log_tail
    marker = json.loads((Path(ref["dir"]) / "node-0" / "status" / "startup-0.json").read_text())
    phases = [phase for phase, _ in marker["history"]]
    assert phases[0] == "started" and phases[-2:] == ["compiling", "stepping"], phases
