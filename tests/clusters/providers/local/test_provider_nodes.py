"""The local provider's node book, health signals, faults and preflight."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from regatta.node import procs

from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.providers.base import Placement, Provider
from clusters.providers.local import LocalProvider
from controlplane.lib.errors import PermanentError
from tests.support.local_fleet import fleet, kill_everything, make_pool

__all__ = ["fleet"]


def test_first_listing_provisions_the_working_size_plus_spares(fleet):
    pool = make_pool(size=2, spare_count=1)

    nodes = fleet.list_nodes(pool)

    assert [n.name for n in nodes] == ["lab-a-0", "lab-a-1", "lab-a-2"]
    assert all(n.ready and not n.unschedulable and n.gpus == 1 for n in nodes)
    assert nodes[0].provider_id == "local://lab/lab-a-0"
    assert [n.name for n in fleet.list_nodes(pool)] == ["lab-a-0", "lab-a-1", "lab-a-2"]
    book = json.loads((fleet.root / "nodes.json").read_text())
    assert sorted(book["pools"]["a"]["nodes"]) == ["lab-a-0", "lab-a-1", "lab-a-2"]


def test_pools_keep_separate_books(fleet):
    fleet.list_nodes(make_pool(size=1, spare_count=0, name="a"))
    nodes = fleet.list_nodes(make_pool(size=1, spare_count=1, name="b"))
    assert [n.name for n in nodes] == ["lab-b-0", "lab-b-1"]


def test_replace_retires_the_node_and_a_new_spare_appears(fleet):
    pool = make_pool(size=2, spare_count=1)
    fleet.list_nodes(pool)
    fleet.inject_fault(pool, "lab-a-1", "preflight_fail")

    new = fleet.replace(pool, "lab-a-1")

    assert new.name == "lab-a-3" and new.ready
    assert [n.name for n in fleet.list_nodes(pool)] == ["lab-a-0", "lab-a-2", "lab-a-3"]
    assert fleet.replace(pool, "lab-a-1") == new, "a repeated replace makes no second node"
    book = json.loads((fleet.root / "nodes.json").read_text())["pools"]["a"]["nodes"]
    assert book["lab-a-1"]["retired"] is True and book["lab-a-1"]["replaced_by"] == "lab-a-3"
    assert book["lab-a-3"]["bad"] is False
    with pytest.raises(PermanentError):
        fleet.provision_node(pool, "lab-a-1")  # a retired name is never reused
    with pytest.raises(PermanentError):
        fleet.inject_fault(pool, "lab-a-1", "kill")


def test_provision_node_adds_a_spare_and_is_idempotent_by_name(fleet):
    pool = make_pool(size=1, spare_count=0)
    fleet.list_nodes(pool)

    extra = fleet.provision_node(pool, "")
    named = fleet.provision_node(pool, "lab-a-extra")

    assert extra.name == "lab-a-1"
    assert fleet.provision_node(pool, "lab-a-extra") == named
    assert [n.name for n in fleet.list_nodes(pool)] == ["lab-a-0", "lab-a-1", "lab-a-extra"]


def test_cordon_and_uncordon_mark_the_node_unschedulable(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)

    fleet.cordon(pool, "lab-a-0")
    fleet.cordon(pool, "lab-a-0")
    assert {n.name: n.unschedulable for n in fleet.list_nodes(pool)} == {
        "lab-a-0": True, "lab-a-1": False, "lab-a-2": False}

    fleet.uncordon(pool, "lab-a-0")
    assert not any(n.unschedulable for n in fleet.list_nodes(pool))
    with pytest.raises(PermanentError):
        fleet.cordon(pool, "lab-a-9")


@pytest.mark.slow  # starts three Python processes
def test_several_processes_listing_at_once_provision_the_pool_once(fleet):
    script = (
        "import sys; from pathlib import Path;"
        "from clusters.providers.local import LocalProvider;"
        "from tests.support.local_fleet import make_pool;"
        f"p = LocalProvider('lab', Path({str(fleet.root)!r}));"
        "[p.list_nodes(make_pool(size=3, spare_count=2)) for _ in range(10)];"
        "p.provision_node(make_pool(size=3, spare_count=2))"
    )
    repo = Path(__file__).resolve().parents[4]
    children = [subprocess.Popen([sys.executable, "-c", script], cwd=repo) for _ in range(3)]
    assert [c.wait(timeout=60) for c in children] == [0, 0, 0]

    names = [n.name for n in fleet.list_nodes(make_pool(size=3, spare_count=2))]
    assert len(names) == 8 and len(set(names)) == 8, "5 provisioned once, plus one per process"


def test_xid_and_spot_notices_come_out_of_health_signals_exactly_once(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)

    xid = fleet.inject_fault(pool, "lab-a-0", "xid")
    spot = fleet.inject_fault(pool, "lab-a-1", "spot_notice")
    signals = fleet.health_signals(pool)

    assert [(s.node, s.kind, s.severity) for s in signals] == [
        ("lab-a-0", "xid", "critical"), ("lab-a-1", "spot_notice", "warning")]
    assert signals[0].evidence["xid"] == 79
    assert signals[0].evidence["message"] == "GPU has fallen off the bus"
    assert signals[1].evidence["action"] == "terminate"
    assert signals[1].evidence["time"] > 0
    assert [s.key for s in signals] == [xid["key"], spot["key"]]
    assert len({s.key for s in signals}) == 2
    assert fleet.health_signals(pool) == []
    assert fleet.health_signals(make_pool(name="b")) == []


def test_a_signal_of_one_pool_is_not_consumed_by_another(fleet):
    a, b = make_pool(name="a"), make_pool(name="b")
    fleet.list_nodes(a)
    fleet.inject_fault(a, "lab-a-0", "xid")

    assert fleet.health_signals(b) == []
    assert [s.node for s in fleet.health_signals(a)] == ["lab-a-0"]


def test_a_kill_fault_on_an_idle_node_marks_it_lost(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)

    evidence = fleet.inject_fault(pool, "lab-a-0", "kill")

    assert evidence == {"fault": "kill", "node": "lab-a-0", "signal": 9, "pids": []}
    assert {n.name: n.ready for n in fleet.list_nodes(pool)}["lab-a-0"] is False
    assert [(s.kind, s.severity) for s in fleet.health_signals(pool)] == [("lost", "critical")]


def test_an_unknown_fault_or_node_is_refused(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)
    with pytest.raises(PermanentError, match="unknown fault"):
        fleet.inject_fault(pool, "lab-a-0", "meteor")
    with pytest.raises(PermanentError, match="no node"):
        fleet.inject_fault(pool, "lab-a-7", "xid")
    assert fleet.health_signals(pool) == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_preflight_passes_on_healthy_nodes_with_bandwidth_figures(fleet):
    pool = make_pool()
    names = [n.name for n in fleet.list_nodes(pool)][:2]

    result = fleet.preflight(pool, (Placement(names[0], 0), Placement(names[1], 1)),
                             timeout_s=60)

    assert result.ok, result.message
    assert result.failed_nodes == ()
    per_node = result.evidence["per_node"]
    assert sorted(per_node) == names
    for name in names:
        assert per_node[name]["ok"] is True and per_node[name]["seconds"] > 0
        assert per_node[name]["algbw_gbps"] > 0 and per_node[name]["busbw_gbps"] > 0
    # The gang's figure is its slowest node's, in the protocol's one place.
    assert result.allreduce_gbps == min(per_node[n]["busbw_gbps"] for n in names) > 0
    assert result.evidence["bytes"] == 8 << 20
    # A cpu pool's nodes hold no GPUs of their own: DCGM is not asked about them.
    assert result.evidence["dcgm"].startswith("not run: the nodes hold no GPUs")
    assert procs.scan(fleet=str(fleet.root)) == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_preflight_fails_naming_the_bad_node_until_it_is_replaced(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)
    fleet.inject_fault(pool, "lab-a-1", "preflight_fail")

    result = fleet.preflight(pool, (Placement("lab-a-0", 0), Placement("lab-a-1", 1)),
                             timeout_s=60)

    assert not result.ok
    assert result.failed_nodes == ("lab-a-1",)
    assert "lab-a-1" in result.message
    bad = result.node_check("lab-a-1")
    assert bad["ok"] is False and bad["check"] == "self-test"
    assert "simulated hardware fault" in bad["error"]
    # The healthy node was stopped at once, not left to time out in the collective.
    assert result.node_check("lab-a-0")["aborted"] is True
    assert result.allreduce_gbps is None
    assert procs.scan(fleet=str(fleet.root)) == []
    new = fleet.replace(pool, "lab-a-1")
    assert fleet.preflight(pool, (Placement("lab-a-0", 0), Placement(new.name, 1)),
                           timeout_s=60).ok


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_preflight_that_times_out_names_the_nodes_that_did_not_report(fleet):
    pool = make_pool()
    fleet.list_nodes(pool)

    result = fleet.preflight(pool, (Placement("lab-a-0", 0), Placement("lab-a-1", 1)),
                             timeout_s=0.5)

    assert not result.ok
    assert result.failed_nodes == ("lab-a-0", "lab-a-1")
    assert "did not report" in result.message
    assert [result.node_check(n)["check"] for n in ("lab-a-0", "lab-a-1")] == ["report"] * 2
    assert procs.scan(fleet=str(fleet.root)) == []


def test_observing_an_attempt_whose_folder_is_gone_says_unknown(fleet):
    ref = {"dir": str(fleet.root / "attempts" / "job-0-a1"), "master_port": 1,
           "nodes": [{"node": "lab-a-0", "node_rank": 0, "pid": 1, "pgid": 1}]}

    status = fleet.observe(ref)

    assert status.state == "unknown" and status.nodes == ()
    fleet.stop(ref, grace_s=1)  # nothing to stop is not an error


def test_for_cluster_builds_it_from_the_cluster_row(db, tmp_path, settings):
    settings.LOCAL_FLEET_DIR = tmp_path / "fleet"
    cluster = Cluster.objects.create(name="cpu-b", provider=Cluster.Provider.LOCAL)

    provider = get_provider(cluster)

    assert isinstance(provider, LocalProvider) and isinstance(provider, Provider)
    assert provider.root == (tmp_path / "fleet" / "cpu-b").resolve()
    cluster.settings = {"fleet_dir": str(tmp_path / "elsewhere")}
    assert get_provider(cluster).root == (tmp_path / "elsewhere" / "cpu-b").resolve()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_preflight_ranks_get_none_of_the_workers_secrets(tmp_path, monkeypatch):
    secrets = {"DATABASE_URL": "postgres://regatta:hunter2@db/regatta", "SECRET_KEY": "s3cret",
               "REDIS_URL": "redis://:hunter2@redis:6379/0", "AWS_SECRET_ACCESS_KEY": "wJalr"}
    for name, value in {**secrets, "NCCL_DEBUG": "INFO"}.items():
        monkeypatch.setenv(name, value)
    # The "python" the provider runs records the environment it was handed,
    # then becomes the real interpreter: torchrun and the check run as usual.
    dumps = tmp_path / "env"
    dumps.mkdir()
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump(dict(os.environ), open(os.path.join({str(dumps)!r}, str(os.getpid())), 'w'))\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
    )
    python.chmod(0o755)
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", python=str(python))
    pool = make_pool()
    try:
        provider.list_nodes(pool)
        result = provider.preflight(pool, (Placement("lab-a-0", 0), Placement("lab-a-1", 1)),
                                    timeout_s=60)
    finally:
        kill_everything(provider.root)

    assert result.ok, result.message
    handed = [json.loads(p.read_text()) for p in dumps.iterdir()]
    assert len(handed) == 2  # one torchrun per node
    for env in handed:
        assert not set(secrets) & set(env)
        assert env["NCCL_DEBUG"] == "INFO" and env["REGATTA_NODE"] in ("lab-a-0", "lab-a-1")
