"""Which provider has which capability beyond the core protocol
(clusters/providers/capabilities.py), and that the passes do without one a
provider lacks rather than calling a method it does not have."""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import services
from clusters.models import Node, NodePool
from clusters.providers import registry
from clusters.providers.base import Provider
from clusters.providers.capabilities import capabilities_of
from clusters.providers.registry import provider_class
from clusters.reconcile import late_logs, reconcile_cluster_unlocked
from controlplane.lib.errors import PermanentError
from jobs.admission.queue import fleet_waiting
from tests.fleet_helpers import memory_cluster
from tests.support.memory_provider import MemoryProvider

pytestmark = pytest.mark.usefixtures("fleet_dirs")

# The core every provider has: nodes and attempts, nothing optional.
CORE = ["cordon", "drain", "for_cluster", "hold_spares", "launch", "list_nodes", "observe",
        "preflight", "provision_node", "replace", "stop", "uncordon"]


def test_the_core_protocol_is_nodes_and_attempts():
    assert sorted(name for name, value in vars(Provider).items() if not name.startswith("_")
                  and (callable(value) or isinstance(value, classmethod))) == CORE


def test_each_provider_has_the_core_and_the_capabilities_it_really_has():
    for kind in ("local", "slurm", "kubernetes"):
        cls = provider_class(kind)
        assert [name for name in CORE if not callable(getattr(cls, name, None))] == [], kind
    assert {kind: capabilities_of(provider_class(kind))
            for kind in ("local", "slurm", "kubernetes")} == {
        "local": ("ReportsHealth", "InjectsFaults", "WaitsForEnvironment", "DescribesStartup"),
        "slurm": (),
        "kubernetes": ("ReportsHealth", "TracksScaling", "KeepsLateLogs", "ClaimsCordons"),
    }


class CoreOnlyProvider:
    """The in-memory fleet (a test double: no process runs) seen through the
    core protocol alone, as a provider with no capability at all."""

    kind = "core-only"
    Settings = MemoryProvider.Settings
    PoolSettings = MemoryProvider.PoolSettings

    def __init__(self, name: str):
        self._fleet = MemoryProvider(name)

    @classmethod
    def for_cluster(cls, name, settings):
        return cls(name)


for _name in CORE:
    if _name != "for_cluster":
        setattr(CoreOnlyProvider, _name,
                lambda self, *args, _name=_name, **kwargs: getattr(self._fleet, _name)(
                    *args, **kwargs))


@pytest.fixture
def core_only(db, monkeypatch):
    cluster = memory_cluster(name="core-a", size=2, spares=1)
    monkeypatch.setitem(registry._IMPLEMENTATIONS, CoreOnlyProvider.kind, CoreOnlyProvider)
    cluster.provider = CoreOnlyProvider.kind
    cluster.save(update_fields=["provider"])
    return cluster


def test_a_provider_with_no_capability_is_a_provider_with_none(core_only):
    assert capabilities_of(CoreOnlyProvider) == ()
    assert isinstance(CoreOnlyProvider("core-a"), Provider)


def test_the_passes_do_without_what_a_provider_lacks(core_only):
    """No health signals to read, no autoscaler's account, no kept logs, no
    fleet environment, no faults: a watch on the pool's asks ends settled, a
    retired node's machine is let go at once, and the rest is not asked."""
    now = timezone.now()
    pool = core_only.pools.get()
    # Its spare retired and none wanted in its place: nothing new is asked.
    NodePool.objects.filter(pk=pool.pk).update(scaling_watch_since=now - timedelta(minutes=1),
                                               spare_count=0)
    retired = Node.objects.filter(pool=pool, is_spare=True).get()
    Node.objects.filter(pk=retired.pk).update(
        state=Node.State.REPLACED, replace_asked_at=now - timedelta(minutes=1))

    reconcile_cluster_unlocked(core_only.id, now)

    pool.refresh_from_db()
    retired.refresh_from_db()
    assert pool.scaling_watch_since is None and pool.scaling_failures == 0
    assert retired.released_at == now
    assert not retired.events.filter(reason__startswith="drained").exists()
    assert late_logs.collect(core_only, CoreOnlyProvider("core-a"), now) == 0
    assert fleet_waiting(core_only) == ""
    with pytest.raises(PermanentError, match="fault injection needs a local cluster"):
        services.inject_fault(Node.objects.filter(cluster=core_only).first(), "xid")


class FaultyProvider(CoreOnlyProvider):
    """A core-only provider that takes faults (recorded, nothing run)."""

    kind = "faulty"
    faults: list = []

    def inject_fault(self, pool, node, kind):
        self.faults.append((node, kind))
        return {"fault": kind}


def test_a_fault_goes_to_any_provider_that_takes_faults(core_only, monkeypatch):
    monkeypatch.setitem(registry._IMPLEMENTATIONS, FaultyProvider.kind, FaultyProvider)
    core_only.provider = FaultyProvider.kind
    core_only.save(update_fields=["provider"])
    node = Node.objects.filter(cluster=core_only).first()
    FaultyProvider.faults.clear()

    assert services.inject_fault(node, "xid") == {"fault": "xid"}
    assert FaultyProvider.faults == [(node.name, "xid")]
