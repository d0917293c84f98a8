"""The fleet API: reads for every person, node actions for operators."""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeEvent, NodeHealthEvent
from clusters.providers import registry
from clusters.providers.local import LocalProvider


@pytest.fixture
def node(cluster):
    return Node.objects.get(name="cpu-a-0")


def test_clusters_show_pools_and_node_counts(api, owner, cluster):
    Node.objects.filter(name="cpu-a-1").update(state="cordoned")
    [data] = api(owner).get("/api/v1/clusters/").data["results"]
    assert data["name"] == "cpu-a" and data["pools"][0]["gpus_per_node"] == 2
    assert data["node_counts"]["ready"] == 4 and data["node_counts"]["cordoned"] == 1
    assert api(owner).get(f"/api/v1/clusters/{cluster.pk}/").data["name"] == "cpu-a"


def test_nodes_filter_by_cluster_pool_and_state(api, owner, cluster):
    Node.objects.filter(name="cpu-a-1").update(state="failed")
    client = api(owner)
    assert client.get("/api/v1/nodes/?cluster=cpu-a").data["count"] == 5
    assert client.get("/api/v1/nodes/?pool=default&state=failed").data["results"][0][
        "name"] == "cpu-a-1"
    assert client.get("/api/v1/nodes/?cluster=cpu-b").data["count"] == 0
    assert client.get("/api/v1/nodes/?state=melted").status_code == 400
    assert client.get("/api/v1/pools/?cluster=cpu-a").data["count"] == 1


def test_a_node_shows_its_recent_events_and_health(api, owner, node):
    node.cordon("xid 79", evidence={"xid": 79})
    NodeHealthEvent.objects.create(node=node, kind="xid", severity="critical", message="XID 79")
    data = api(owner).get(f"/api/v1/nodes/{node.pk}/").data
    assert data["events"][0]["reason"] == "xid 79"
    assert data["health_events"][0]["kind"] == "xid"


def test_a_node_shows_when_it_last_passed_a_preflight_check_read_only(api, operator, node):
    assert api(operator).get(f"/api/v1/nodes/{node.pk}/").data["preflight_passed_at"] is None
    passed = timezone.now()
    Node.objects.filter(pk=node.pk).update(preflight_passed_at=passed)
    client = api(operator)
    data = client.get("/api/v1/nodes/?cluster=cpu-a&state=ready").data["results"]
    shown = {n["name"]: n["preflight_passed_at"] for n in data}
    assert shown[node.name] == passed.isoformat().replace("+00:00", "Z")
    client.patch(f"/api/v1/nodes/{node.pk}/", {"preflight_passed_at": None}, format="json")
    node.refresh_from_db()
    assert node.preflight_passed_at == passed


def test_health_events_filter_by_node_cluster_and_severity(api, owner, node):
    NodeHealthEvent.objects.create(node=node, kind="xid", severity="critical", message="XID 79")
    NodeHealthEvent.objects.create(node=node, kind="thermal", severity="warning", message="hot")
    client = api(owner)
    assert client.get("/api/v1/health-events/?severity=critical").data["count"] == 1
    assert client.get("/api/v1/health-events/?node=cpu-a-0&cluster=cpu-a").data["count"] == 2
    assert client.get("/api/v1/health-events/?node=cpu-a-3").data["count"] == 0


def test_an_operator_cordons_uncordons_and_drains(api, operator, node,
                                                  django_capture_on_commit_callbacks):
    client = api(operator)
    with django_capture_on_commit_callbacks() as callbacks:
        resp = client.post(f"/api/v1/nodes/{node.pk}/cordon/", {"reason": "flaky NIC"},
                           format="json")
    assert resp.status_code == 200 and resp.data["state"] == "cordoned"
    assert len(callbacks) == 1
    event = NodeEvent.objects.get(node=node)
    assert (event.from_state, event.to_state, event.actor) == ("ready", "cordoned", "user:opal")
    assert "flaky NIC" in event.reason
    # A repeated cordon writes nothing.
    assert client.post(f"/api/v1/nodes/{node.pk}/cordon/").status_code == 200
    assert NodeEvent.objects.filter(node=node).count() == 1
    assert client.post(f"/api/v1/nodes/{node.pk}/uncordon/").data["state"] == "ready"
    assert client.post(f"/api/v1/nodes/{node.pk}/drain/", {"reason": "kernel"},
                       format="json").data["state"] == "draining"
    assert NodeEvent.objects.filter(node=node).count() == 3


def test_an_illegal_node_transition_is_409(api, operator, node):
    Node.objects.filter(pk=node.pk).update(state="terminated")
    resp = api(operator).post(f"/api/v1/nodes/{node.pk}/uncordon/")
    assert resp.status_code == 409
    assert not NodeEvent.objects.exists()


def test_replace_marks_the_node_once(api, operator, node):
    client = api(operator)
    assert client.post(f"/api/v1/nodes/{node.pk}/replace/", {"reason": "ECC"},
                       format="json").status_code == 200
    node.refresh_from_db()
    asked = node.replace_requested_at
    assert asked is not None and node.state == "ready"
    event = NodeEvent.objects.get(node=node)
    assert (event.from_state, event.to_state) == ("ready", "ready")
    assert event.reason.startswith("replacement requested by opal")
    assert client.post(f"/api/v1/nodes/{node.pk}/replace/").status_code == 200
    node.refresh_from_db()
    assert node.replace_requested_at == asked and NodeEvent.objects.count() == 1


def test_a_retired_node_cannot_be_replaced(api, operator, node):
    Node.objects.filter(pk=node.pk).update(state="replaced")
    assert api(operator).post(f"/api/v1/nodes/{node.pk}/replace/").status_code == 409


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain", "replace", "faults"])
def test_people_who_are_not_operators_cannot_act_on_nodes(api, owner, node, action):
    resp = api(owner).post(f"/api/v1/nodes/{node.pk}/{action}/", {"kind": "kill"},
                           format="json")
    assert resp.status_code == 403
    node.refresh_from_db()
    assert node.state == "ready" and node.replace_requested_at is None
    assert not NodeEvent.objects.exists()


class RecordingProvider:
    """Test-only provider registered for one test: it records the fault call
    so the test can see the API reached the provider (the real local
    provider would signal real processes)."""

    calls = []
    Settings = LocalProvider.Settings
    PoolSettings = LocalProvider.PoolSettings

    @classmethod
    def for_cluster(cls, name, settings):
        return cls()

    def inject_fault(self, pool, node, kind):
        self.calls.append((pool.cluster, pool.name, node, kind))
        return {"injected": kind}


def test_a_fault_reaches_the_local_provider(api, operator, node, cluster, monkeypatch):
    monkeypatch.setitem(registry._IMPLEMENTATIONS, "local",
                        f"{__name__}:RecordingProvider")
    RecordingProvider.calls.clear()
    resp = api(operator).post(f"/api/v1/nodes/{node.pk}/faults/", {"kind": "xid"},
                              format="json")
    assert resp.status_code == 202, resp.content
    assert resp.data["result"] == {"injected": "xid"}
    assert RecordingProvider.calls == [("cpu-a", "default", "cpu-a-0", "xid")]


def test_faults_need_a_known_kind_and_a_local_cluster(api, operator, node, cluster):
    client = api(operator)
    assert client.post(f"/api/v1/nodes/{node.pk}/faults/", {"kind": "meteor"},
                       format="json").status_code == 400
    Cluster.objects.filter(pk=cluster.pk).update(provider="kubernetes")
    resp = client.post(f"/api/v1/nodes/{node.pk}/faults/", {"kind": "kill"}, format="json")
    assert resp.status_code == 409 and "local" in resp.data["detail"]
