"""What each rank of a launched attempt is doing before its first step, read
on the local fleet from the launcher's, standby's and ranks' own records
(clusters/providers/local/startup.py): real torchrun agents and ranks, cold
and handed to a warm standby."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusters.providers.local import LocalProvider
from tests.support.local_fleet import kill_everything, make_pool, request, wait_ready
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STALLED = str(Path(__file__).resolve().parents[4] / "tests" / "support" / "stalled_ranks.py")
SDK_EXAMPLE = str(Path(__file__).resolve().parents[4] / "examples" / "train_ddp_sdk.py")


@pytest.fixture
def lab(tmp_path):
    cold = LocalProvider("lab", tmp_path / "fleet" / "lab")
    warm = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    try:
        yield cold, warm
    finally:
        kill_everything(cold.root)


def phase(ref: dict, rank: int) -> str:
    path = Path(ref["dir"]) / "node-0" / "status" / f"startup-{rank}.json"
    try:
        return json.loads(path.read_text()).get("phase", "")
    except (OSError, ValueError):
        return ""


def by_rank(provider, ref) -> dict:
    return {r.rank: r for r in provider.describe_startup(ref)}


@pytest.mark.parametrize("how", ["cold", "warm"])
def test_a_rank_that_never_comes_reads_as_importing_and_its_peer_as_waiting_in_rendezvous(
        lab, how):
    cold, warm = lab
    provider = warm if how == "warm" else cold
    pool = make_pool(size=1, spare_count=0)
    if how == "warm":
        node = provider.list_nodes(pool)[0].name
        provider.hold_spares(pool, [node])
        wait_ready(provider, [node])
    ref = provider.launch(request(provider, pool, f"stall-{how}", nodes=1, nproc=2,
                                  command=(STALLED,)))
    assert [n["warm"] for n in ref["nodes"]] == [how == "warm"]
    eventually(lambda: phase(ref, 0) == "rendezvous", timeout=120, what="rank 0 in rendezvous")

    # Rank 1 is forked or started a moment after rank 0.
    ranks = eventually(lambda: (r := by_rank(provider, ref)) and r[1].state != "not started"
                       and r, timeout=60, what="rank 1 started")

    assert sorted(ranks) == [0, 1]
    assert ranks[0].state == "rendezvous", ranks[0]
    assert "init_process_group" in ranks[0].detail
    assert ranks[0].since_s is not None and ranks[0].since_s >= 0
    assert ranks[1].state == "importing", ranks[1]
    assert ranks[1].node == ref["nodes"][0]["node"]
    assert "CPU" in ranks[1].detail  # its process was found, and how much it worked
    provider.stop(ref, grace_s=5)


def test_an_sdk_program_that_steps_with_no_control_plane_reads_as_running_without_reporting(lab):
    cold, _ = lab
    pool = make_pool(size=1, spare_count=0)
    ref = cold.launch(request(cold, pool, "quiet", nodes=1, nproc=1, command=(SDK_EXAMPLE,),
                              env={"REGATTA_CONFIG": json.dumps({"steps": 100000,
                                                                 "sleep": 0.05})}))
    eventually(lambda: phase(ref, 0) == "stepping", timeout=120, what="rank 0 stepping")

    rank = by_rank(cold, ref)[0]

    assert rank.state == "running without reporting", rank
    assert "ran step 1" in rank.detail
    cold.stop(ref, grace_s=5)


def test_a_node_whose_launcher_has_not_started_reads_as_not_started(lab, tmp_path):
    cold, _ = lab
    pool = make_pool(size=1, spare_count=0)
    ref = cold.launch(request(cold, pool, "done", nodes=1, nproc=1))
    # The same attempt's folder as a launch that wrote its placement and
    # nothing more (the launcher still starting).
    node_dir = Path(ref["dir"]) / "node-0"
    eventually(lambda: (node_dir / "exit.json").exists(), timeout=60, what="the run's end")
    for name in ("launcher.json", "exit.json"):
        (node_dir / name).unlink()
    for record in (node_dir / "status").glob("*.json"):
        record.unlink()

    rank = by_rank(cold, ref)[0]

    assert (rank.state, rank.detail) == ("not started", "no launcher on its node yet")
