"""Warm standbys are a pool's choice too (LocalPoolSettings.standbys): a
pool set to false launches cold and holds no standby though its cluster
keeps them, and the pool setting is checked when the pool is saved."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from regatta.node import standby

from clusters.models import Cluster, NodePool
from clusters.providers.base import PoolInfo
from clusters.providers.local import LocalProvider
from clusters.providers.local.provider import LocalPoolSettings
from tests.support.local_fleet import kill_everything, request, wait_done

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_pool_without_standbys_launches_cold_in_a_cluster_that_keeps_them(tmp_path):
    provider = LocalProvider("lab", tmp_path / "fleet" / "lab", standbys=True)
    cold = PoolInfo(cluster="lab", name="cold", instance_type="local-cpu", gpus_per_node=1,
                    size=2, settings=LocalPoolSettings(standbys=False))
    try:
        nodes = [n.name for n in provider.list_nodes(cold)]
        provider.hold_spares(cold, nodes)
        ref = provider.launch(request(provider, cold, "cold"))
        status = wait_done(provider, ref)
    finally:
        kill_everything(provider.root)

    assert status.state == "succeeded", status.message
    assert [n["warm"] for n in ref["nodes"]] == [False, False]
    # No standby was started: not for the spares, nor after the launch.
    assert not any(standby.standby_dir(provider.root, n).exists() for n in nodes)


@pytest.mark.django_db
def test_a_pools_standbys_setting_is_checked_when_the_pool_is_saved():
    cluster = Cluster.objects.create(name="lab", provider=Cluster.Provider.LOCAL)
    pool = NodePool(cluster=cluster, name="cold", gpus_per_node=1, size=1,
                    settings={"standbys": "sometimes"})
    with pytest.raises(ValidationError, match="standbys"):
        pool.full_clean()
    pool.settings = {"standbys": False, "devices": "cuda"}
    pool.full_clean()
    pool.save()
    assert pool.config.standbys is False
