"""The local fleet's preflight on nodes that hold warm standbys: the check
runs in the standbys (torch imported already) instead of two cold Python
starts per node, and each node keeps a standby for the launch that follows.
Real torchrun agents and a real gloo all-reduce."""

from __future__ import annotations

import pytest

from clusters.providers.base import Placement
from clusters.providers.local import LocalProvider
from tests.support.local_fleet import info, kill_everything, make_pool, request, wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def warm_fleet(tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    try:
        yield provider
    finally:
        kill_everything(provider.root)


def test_the_preflight_runs_in_the_nodes_standbys_and_leaves_them_warm_for_the_launch(
        warm_fleet):
    pool = make_pool()
    nodes = [n.name for n in warm_fleet.list_nodes(pool)][:2]
    warm_fleet.hold_spares(pool, nodes)
    wait_ready(warm_fleet, nodes)

    result = warm_fleet.preflight(
        pool, tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes)), 90.0)

    assert result.ok, result.message
    assert sorted(result.evidence["warm_nodes"]) == sorted(nodes)
    assert result.allreduce_gbps and result.allreduce_gbps > 0
    # Each standby left a successor: the launch after the check is warm too.
    wait_ready(warm_fleet, nodes)
    ref = warm_fleet.launch(request(warm_fleet, pool, "after-preflight"))
    assert [n["warm"] for n in ref["nodes"]] == [True, True]


def test_a_node_without_a_standby_is_checked_cold_beside_a_warm_one(warm_fleet):
    pool = make_pool()
    nodes = [n.name for n in warm_fleet.list_nodes(pool)][:2]
    warm_fleet.hold_spares(pool, nodes[:1])
    wait_ready(warm_fleet, nodes[:1])

    result = warm_fleet.preflight(
        pool, tuple(Placement(node=n, node_rank=i) for i, n in enumerate(nodes)), 90.0)

    assert result.ok, result.message
    assert result.evidence["warm_nodes"] == nodes[:1]
    assert not info(warm_fleet, nodes[1])
