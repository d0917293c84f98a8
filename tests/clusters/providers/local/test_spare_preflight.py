"""A spare on the local fleet is checked when it joins: a real one-node
preflight (one torchrun, world size 1) through the provider protocol."""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool
from clusters.providers import get_provider, pool_info
from clusters.reconcile import reconcile_cluster_unlocked
from tests.fleet_helpers import later
from tests.support.local_fleet import kill_everything

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.usefixtures("fleet_dirs")]


@pytest.fixture
def lab_cluster(db, tmp_path):
    lab_cluster = Cluster.objects.create(
        name="lab", provider=Cluster.Provider.LOCAL,
        settings={"fleet_dir": str(tmp_path / "fleet"), "preflight_timeout_s": 90.0},
    )
    NodePool.objects.create(cluster=lab_cluster, name="cpu", gpus_per_node=1, size=1, spare_count=1)
    try:
        yield lab_cluster
    finally:
        kill_everything(get_provider(lab_cluster).root)


def test_a_local_spare_passes_a_one_node_check_when_it_joins(lab_cluster):
    now = timezone.now()
    reconcile_cluster_unlocked(lab_cluster.id, now)

    spare = Node.objects.get(cluster=lab_cluster, is_spare=True)
    assert spare.state == Node.State.READY and spare.preflight_passed_at == now
    check = spare.events.get(reason="passed its preflight check on joining").evidence
    assert check["preflight"]["ok"] is True and check["preflight"]["world_size"] == 1
    assert Node.objects.get(cluster=lab_cluster, is_spare=False).preflight_passed_at is None


def test_a_local_spare_that_fails_its_join_check_is_cordoned_with_the_failing_check(lab_cluster):
    now = timezone.now()
    reconcile_cluster_unlocked(lab_cluster.id, now)
    spare = Node.objects.get(cluster=lab_cluster, is_spare=True)
    get_provider(lab_cluster).inject_fault(pool_info(spare.pool), spare.name, "preflight_fail")
    Node.objects.filter(pk=spare.pk).update(preflight_passed_at=None)  # as if it just joined

    reconcile_cluster_unlocked(lab_cluster.id, later(now, 5))

    spare.refresh_from_db()
    assert spare.state == Node.State.CORDONED and spare.preflight_passed_at is None
    health = spare.health_events.get()
    assert health.evidence["preflight"]["check"] == "self-test"
    assert "simulated hardware fault" in health.evidence["preflight"]["error"]
    reconcile_cluster_unlocked(lab_cluster.id, later(now, 10))
    fresh = Node.objects.get(cluster=lab_cluster, is_spare=True, state=Node.State.READY)
    assert fresh.pk != spare.pk and fresh.preflight_passed_at == later(now, 10)
