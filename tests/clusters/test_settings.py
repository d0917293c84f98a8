"""Typed cluster and pool settings: parsed once, every bad key named when the
cluster is saved, read as attributes by the reconcilers and providers."""

import json

import pytest

from clusters.models import Cluster, NodePool
from clusters.settings import ClusterSettings, parse_pool
from controlplane.lib.typed_settings import SettingsError


def test_defaults_need_no_settings_at_all():
    cfg = ClusterSettings.parse({}, "local")
    assert cfg.preflight_on and cfg.observe_interval_s == 5.0 and cfg.stop_grace_s == 10.0
    assert cfg.provider.fleet_dir == ""


def test_true_false_or_a_mode_turn_the_preflight_on_and_off():
    assert not ClusterSettings.parse({"preflight": False}, "local").preflight_on
    assert ClusterSettings.parse({"preflight": True}, "local").preflight_on
    cfg = ClusterSettings.parse({"preflight": "dcgm-labels", "api_url": "http://x"}, "kubernetes")
    assert cfg.preflight_on and cfg.provider.preflight == "dcgm-labels"
    with pytest.raises(SettingsError, match="preflight"):
        ClusterSettings.parse({"preflight": "dcgm-labels"}, "local")


def test_every_bad_key_is_named_at_once():
    with pytest.raises(SettingsError) as caught:
        ClusterSettings.parse({"observe_interval_s": "soon", "stop_grace_s": -1,
                               "obsreve_interval_s": 1}, "local")
    assert set(caught.value.problems) == {"obsreve_interval_s"}
    with pytest.raises(SettingsError) as caught:
        ClusterSettings.parse({"observe_interval_s": "soon", "stop_grace_s": -1}, "local")
    assert set(caught.value.problems) == {"observe_interval_s", "stop_grace_s"}


def test_a_key_of_another_provider_is_not_a_setting_here():
    with pytest.raises(SettingsError, match="namespace.*local"):
        ClusterSettings.parse({"namespace": "training"}, "local")
    cfg = ClusterSettings.parse({"namespace": "training", "api_url": "http://x"}, "kubernetes")
    assert cfg.provider.namespace == "training"


def test_standby_imports_are_module_names():
    cfg = ClusterSettings.parse({"standby_imports": ["transformers.trainer", "lightning"]},
                                "local")
    assert cfg.provider.standby_imports == ("transformers.trainer", "lightning")
    for bad in (["transformers trainer"], ["lightning", ""], "lightning", [3]):
        with pytest.raises(SettingsError, match="standby_imports") as caught:
            ClusterSettings.parse({"standby_imports": bad}, "local")
        assert set(caught.value.problems) == {"standby_imports"}


def test_pool_settings_belong_to_the_provider():
    pool = parse_pool({"asg_name": "p5-group", "efa_devices": 32}, "kubernetes")
    assert (pool.asg_name, pool.efa_devices, pool.node_autoscaler) == ("p5-group", 32, "")
    with pytest.raises(SettingsError, match="asg_name"):
        parse_pool({"asg_name": "p5-group"}, "local")
    with pytest.raises(SettingsError, match="node_autoscaler"):
        parse_pool({"node_autoscaler": "cluster-autoscaler"}, "kubernetes")


def test_a_models_config_follows_edits_to_its_settings(db):
    cluster = Cluster.objects.create(name="c1", provider="local", settings={"stop_grace_s": 3})
    assert cluster.config.stop_grace_s == 3.0
    cluster.settings = {"stop_grace_s": 7}
    assert cluster.config.stop_grace_s == 7.0


def admin_add_form(name, settings, pool_settings=None):
    form = {"name": name, "provider": "local", "settings": json.dumps(settings),
            "description": "", "created_at_0": "2026-11-23", "created_at_1": "10:00:00",
            "pools-TOTAL_FORMS": "0", "pools-INITIAL_FORMS": "0",
            "pools-MIN_NUM_FORMS": "0", "pools-MAX_NUM_FORMS": "1000"}
    if pool_settings is not None:
        form.update({"pools-TOTAL_FORMS": "1", "pools-0-name": "cpu",
                     "pools-0-instance_type": "local-cpu", "pools-0-gpus_per_node": "1",
                     "pools-0-capacity_type": "on_demand", "pools-0-size": "2",
                     "pools-0-spare_count": "1", "pools-0-node_selector": "{}",
                     "pools-0-tolerations": "[]",
                     "pools-0-settings": json.dumps(pool_settings)})
    return form


def test_the_admin_refuses_a_cluster_with_a_bad_setting_naming_it(admin_client):
    resp = admin_client.post("/admin/clusters/cluster/add/",
                             admin_add_form("lab", {"observe_intervall_s": 2}))
    assert resp.status_code == 200
    assert "observe_intervall_s" in resp.content.decode()
    assert not Cluster.objects.exists()


def test_the_admin_refuses_a_pool_with_a_bad_setting_naming_it(admin_client):
    resp = admin_client.post("/admin/clusters/cluster/add/",
                             admin_add_form("lab", {}, pool_settings={"asg_name": "x"}))
    assert resp.status_code == 200
    assert "asg_name" in resp.content.decode()
    assert not Cluster.objects.exists() and not NodePool.objects.exists()


def test_the_admin_saves_a_cluster_with_good_settings(admin_client):
    resp = admin_client.post("/admin/clusters/cluster/add/",
                             admin_add_form("lab", {"stop_grace_s": 3}, pool_settings={}))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Cluster.objects.get(name="lab").config.stop_grace_s == 3.0


def test_sharing_settings_are_typed():
    cfg = ClusterSettings.parse({}, "local")
    assert cfg.fair_share and cfg.preemption_checkpoint_wait_s == 120.0
    with pytest.raises(SettingsError) as caught:
        ClusterSettings.parse({"fair_share": "yes", "preemption_checkpoint_wait_s": -5},
                              "local")
    assert set(caught.value.problems) == {"fair_share", "preemption_checkpoint_wait_s"}


def test_any_pool_may_name_a_topology_label():
    assert parse_pool({"topology_label": "rack"}, "local") is not None
    with pytest.raises(SettingsError) as caught:
        parse_pool({"topology_label": ["rack"]}, "local", "gpu")
    assert set(caught.value.problems) == {"topology_label"}
