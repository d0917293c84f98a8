"""Warm standbys on the local fleet (regatta/node/standby.py): a
launch handed to a node's standby runs the same gang as a cold launch, with
the same environment, exit codes, signals, stop and faults; without a ready
standby it goes cold. Real torchrun agents and gloo ranks throughout."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from regatta.node import procs, standby
from regatta.storage import open_storage

from clusters.providers.base import FaultKind
from clusters.providers.local import LocalProvider
from tests.support.local_fleet import (
    alive,
    info,
    kill_everything,
    make_pool,
    request,
    wait_done,
    wait_ready,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SDK_EXAMPLE = str(Path(__file__).resolve().parents[4] / "examples" / "train_ddp_sdk.py")


@pytest.fixture
def warm_fleet(tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    try:
        yield provider
    finally:
        kill_everything(provider.root)


def idle_standbys(provider: LocalProvider, node: str) -> list[procs.Proc]:
    return [p for p in procs.scan(fleet=str(provider.root), node=node)
            if procs.ATTEMPT_TAG not in p.env]


def warm_launch(provider, pool, name, command=None, **env):
    nodes = [n.name for n in provider.list_nodes(pool)][:2]
    provider.hold_spares(pool, nodes)
    wait_ready(provider, nodes)
    ref = provider.launch(request(provider, pool, name, env=env, command=command))
    assert [n["warm"] for n in ref["nodes"]] == [True, True]
    return ref


def all_ended(provider, ref):
    """The attempt once every node's launcher has ended (`wait_done` returns
    at the first failed node)."""
    return eventually(lambda: (s := provider.observe(ref)) and not any(
        n.running for n in s.nodes) and s, timeout=90, what="every node to end")


def contract(env_file: Path) -> dict:
    env = json.loads(env_file.read_text())
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "MASTER_ADDR", "OMP_NUM_THREADS",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "REGATTA_NODE",
             "REGATTA_TEST_STEPS")
    return {k: env.get(k) for k in names} | {"keys": sorted(
        k for k in env if not k.startswith(("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID")))}


def test_a_launch_handed_to_the_standbys_runs_the_gang_as_a_cold_launch_does(warm_fleet):
    pool = make_pool(size=2, spare_count=0)
    ref = warm_launch(warm_fleet, pool, "warm", REGATTA_TEST_DUMP_ENV="1")
    status = wait_done(warm_fleet, ref)
    assert status.state == "succeeded", status.message
    assert [r["sum"] for n in status.nodes for r in n.ranks] == [8.0, 8.0]  # 3 all-reduces

    cold = LocalProvider("lab", warm_fleet.root)  # the same nodes, no standbys
    cold_ref = cold.launch(request(cold, pool, "cold", env={"REGATTA_TEST_DUMP_ENV": "1"}))
    assert [n["warm"] for n in cold_ref["nodes"]] == [False, False]
    assert wait_done(cold, cold_ref).state == "succeeded"
    for node_rank in (0, 1):
        warm_env = Path(ref["dir"]) / f"node-{node_rank}" / "status" / f"env-{node_rank}.json"
        cold_env = Path(cold_ref["dir"]) / f"node-{node_rank}" / "status" / f"env-{node_rank}.json"
        assert contract(warm_env) == contract(cold_env)
        # Imports resolve as in a cold rank: nothing of the standby's own
        # start (its folder, its package) is left on the path.
        warm_path, cold_path = (json.loads((Path(r["dir"]) / f"node-{node_rank}" / "status"
                                            / f"path-{node_rank}.json").read_text())
                                for r in (ref, cold_ref))
        assert warm_path == cold_path


def test_a_warm_ranks_exit_code_and_a_killed_warm_ranks_signal_are_read_back(warm_fleet):
    pool = make_pool(size=2, spare_count=0)
    ref = warm_launch(warm_fleet, pool, "exit85", REGATTA_TEST_EXIT="85")
    status = all_ended(warm_fleet, ref)
    assert status.state == "failed"
    assert {n.exit_code for n in status.nodes} == {85}

    ref = warm_launch(warm_fleet, pool, "killed", REGATTA_TEST_STEPS="100000")
    eventually(lambda: all(any((Path(ref["dir"]) / f"node-{i}" / "status").glob("progress-*"))
                           for i in (0, 1)), timeout=60, what="both ranks stepping")
    warm_fleet.kill_rank(ref, rank=1)
    status = all_ended(warm_fleet, ref)
    assert status.state == "failed"
    killed = next(n for n in status.nodes if n.node_rank == 1)
    assert killed.signal == 9


def test_a_warm_sdk_programs_survivor_hands_over_its_last_step(warm_fleet, tmp_path):
    """The SDK example, warm on both nodes, with rank 1 killed: rank 0's
    uncaught collective error reaches the SDK's hook as it would in a cold
    `python` (not torch's process wrapper, which skips it), so it hands
    over the step it completed and exits 84, the lost-peer code."""
    pool = make_pool(size=2, spare_count=0)
    ckpt = tmp_path / "ckpt"
    ref = warm_launch(warm_fleet, pool, "sdk", command=(SDK_EXAMPLE,),
                      REGATTA_CHECKPOINT_URI=str(ckpt), REGATTA_CHECKPOINT_EVERY="5",
                      REGATTA_CONFIG=json.dumps({"steps": 400, "sleep": 0.1}))
    store = open_storage(str(ckpt))
    eventually(lambda: store.is_committed(5), timeout=90, what="step 5 committed")
    time.sleep(1.0)  # a few steps past the checkpoint
    warm_fleet.kill_rank(ref, rank=1)
    status = all_ended(warm_fleet, ref)

    survivor = next(n for n in status.nodes if n.node_rank == 0)
    assert survivor.exit_code == 84, status.message
    handed = store.committed_steps()[-1]
    assert handed % 5 != 0, store.committed_steps()  # not a periodic save
    assert store.verify(handed) == (True, "ok")


def test_stop_ends_a_warm_attempt_and_a_node_kill_takes_the_idle_standby(warm_fleet):
    pool = make_pool(size=3, spare_count=0)
    spare = [n.name for n in warm_fleet.list_nodes(pool)][2]
    warm_fleet.hold_spares(pool, [spare])
    ref = warm_launch(warm_fleet, pool, "long", REGATTA_TEST_STEPS="100000")
    wait_ready(warm_fleet, [spare])
    assert procs.scan(attempt_dir=ref["dir"])
    warm_fleet.stop(ref, grace_s=10)
    assert procs.scan(attempt_dir=ref["dir"]) == []
    assert wait_done(warm_fleet, ref).state != "running"
    assert len(idle_standbys(warm_fleet, spare)) == 1  # stop is the attempt's alone

    warm_fleet.inject_fault(pool, spare, FaultKind.KILL)
    assert idle_standbys(warm_fleet, spare) == []


def test_without_a_ready_standby_or_with_a_loader_path_of_its_own_the_launch_goes_cold(
        warm_fleet):
    pool = make_pool(size=2, spare_count=0)
    ref = warm_fleet.launch(request(warm_fleet, pool, "none-ready"))
    assert [n["warm"] for n in ref["nodes"]] == [False, False]
    assert wait_done(warm_fleet, ref).state == "succeeded"

    nodes = [n.name for n in warm_fleet.list_nodes(pool)]
    wait_ready(warm_fleet, nodes)  # the next ones, started after that launch
    ref = warm_fleet.launch(request(warm_fleet, pool, "own-loader",
                                    env={"LD_LIBRARY_PATH": "/opt/elsewhere"}))
    assert [n["warm"] for n in ref["nodes"]] == [False, False]
    assert wait_done(warm_fleet, ref).state == "succeeded"
    # Refused, not spent: the standbys still wait for a launch they can take.
    assert all(info(warm_fleet, n).get("state") == "ready" for n in nodes)


def test_a_clusters_further_imports_are_done_ahead_and_a_launch_of_other_variables_goes_cold(
        tmp_path):
    """`standby_imports`: the standby imports them before any launch, so a
    warm rank starts with them loaded; a launch that sets a variable of its
    own (one such a module may read as it is imported) goes cold, where
    the program's imports see it, and leaves the standbys waiting."""
    further = "xml.dom.minidom"  # imported by nothing else here
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True,
                             standby_imports=(further,))
    try:
        pool = make_pool(size=2, spare_count=0)
        nodes = [n.name for n in provider.list_nodes(pool)]
        ref = warm_launch(provider, pool, "warm", REGATTA_TEST_DUMP_ENV="1")
        assert wait_done(provider, ref).state == "succeeded"
        for node_rank in (0, 1):
            status = Path(ref["dir"]) / f"node-{node_rank}" / "status"
            assert further in json.loads((status / f"modules-{node_rank}.json").read_text())
            env = json.loads((status / f"env-{node_rank}.json").read_text())
            assert standby.IMPORTS not in env  # the standby's own
        assert all(further in info(provider, n)["preloaded"] for n in nodes)

        own = provider.launch(request(provider, pool, "own-variable",
                                      env={"HF_HOME": str(tmp_path / "hf"),
                                           "REGATTA_TEST_DUMP_ENV": "1"}))
        assert [n["warm"] for n in own["nodes"]] == [False, False]
        assert wait_done(provider, own).state == "succeeded"
        modules = Path(own["dir"]) / "node-0" / "status" / "modules-0.json"
        assert further not in json.loads(modules.read_text())
        assert all(info(provider, n).get("state") == "ready" for n in nodes)
    finally:
        kill_everything(provider.root)


def test_a_standby_that_takes_a_launch_leaves_its_successor_ready_at_once(warm_fleet):
    """A second failure soon after the first restarts warm too: the standby
    that took the launch forked the node's next standby before it became
    the launcher, with the imports done, so it is ready before the attempt
    has ended, and the next launch is warm on every node with no wait."""
    pool = make_pool(size=2, spare_count=0)
    nodes = [n.name for n in warm_fleet.list_nodes(pool)][:2]
    first = warm_launch(warm_fleet, pool, "first", REGATTA_TEST_STEPS="100000")
    took = {n["node"]: n["pid"] for n in first["nodes"]}  # now the nodes' launchers
    successors = {n: info(warm_fleet, n) for n in nodes}
    assert all(s.get("state") == "ready" for s in successors.values()), successors
    assert all(successors[n]["pid"] != took[n] for n in nodes)
    assert all(len(idle_standbys(warm_fleet, n)) == 1 for n in nodes)
    warm_fleet.stop(first, grace_s=10)

    second = warm_fleet.launch(request(warm_fleet, pool, "second"))

    assert [n["warm"] for n in second["nodes"]] == [True, True]
    assert wait_done(warm_fleet, second).state == "succeeded"


def test_a_node_holds_one_standby_however_often_it_is_asked(warm_fleet):
    pool = make_pool(size=1, spare_count=0)
    node = warm_fleet.list_nodes(pool)[0].name
    for _ in range(3):
        standby.ensure(warm_fleet.root, [node], warm_fleet.python, {})
        time.sleep(0.2)
    wait_ready(warm_fleet, [node])
    assert len(idle_standbys(warm_fleet, node)) == 1
    warm_fleet.stop_standbys()
    assert idle_standbys(warm_fleet, node) == []


def test_the_fleet_imports_once_and_each_forked_standby_is_its_own_nodes(warm_fleet):
    """One torch import for the whole fleet: the first node's standby forks
    the others' once its imports are done, and a node that needs one later
    gets a fork of a ready one. A forked standby is its node's alone (its
    session, socket and tags): a kill of the node it came from spares it,
    and a launch on its node runs warm."""
    pool = make_pool(size=3, spare_count=0)
    nodes = [n.name for n in warm_fleet.list_nodes(pool)]
    warm_fleet.hold_spares(pool, nodes)
    wait_ready(warm_fleet, nodes)
    first, *others = nodes
    records = {n: info(warm_fleet, n) for n in nodes}
    assert "forked_from" not in records[first]
    assert [records[n].get("forked_from") for n in others] == [first, first]
    assert len({r["pid"] for r in records.values()}) == 3
    sessions = {n: os.getsid(r["pid"]) for n, r in records.items()}
    assert len(set(sessions.values())) == 3
    assert all([p.pid for p in idle_standbys(warm_fleet, n)] == [records[n]["pid"]]
               for n in nodes)

    warm_fleet.inject_fault(pool, first, FaultKind.KILL)
    assert idle_standbys(warm_fleet, first) == []
    assert all(alive(records[n]["pid"]) for n in others)

    warm_fleet.hold_spares(pool, [first])  # forked at once from a ready one
    again = info(warm_fleet, first)
    assert again.get("forked_from") in others and again.get("state") in ("starting", "ready")
    wait_ready(warm_fleet, [first])

    ref = warm_fleet.launch(request(warm_fleet, pool, "forked", nodes=3))
    assert [n["warm"] for n in ref["nodes"]] == [True, True, True]
    status = wait_done(warm_fleet, ref)
    assert status.state == "succeeded", status.message
