"""The fleet page does not grow with the fleet: per pool it counts nodes by
state, it lists the nodes that need attention, and it shows node tiles a
page at a time, narrowed by state, cluster or pool."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool
from frontend.fleet import ATTENTION_SHOWN, TILES_PER_PAGE

from .factories import make_job, run, xid


def add_nodes(cluster, pool, n, start=0, **fields):
    return Node.objects.bulk_create([
        Node(cluster=cluster, pool=pool, name=f"{pool.name}-{i:05d}", gpus=pool.gpus_per_node,
             state=Node.State.READY, **fields) for i in range(start, start + n)])


@pytest.fixture
def big(cluster):
    """A second cluster with two pools: 120 ready nodes (3 of them spares),
    and one each cordoned, draining, failed and provisioning."""
    big = Cluster.objects.create(name="gpu-b", provider=Cluster.Provider.LOCAL)
    h100 = NodePool.objects.create(cluster=big, name="h100", gpus_per_node=8, size=120)
    a10 = NodePool.objects.create(cluster=big, name="a10", gpus_per_node=1, size=4)
    add_nodes(big, h100, 117)
    add_nodes(big, h100, 3, start=117, is_spare=True)
    for i, state in enumerate(("cordoned", "draining", "failed", "provisioning")):
        Node.objects.create(cluster=big, pool=a10, name=f"a10-{i}", gpus=1, state=state,
                            state_reason=f"because {state}")
    Node.objects.create(cluster=big, pool=a10, name="a10-gone", gpus=1, state="terminated")
    return big


def tile_names(html: str) -> list[str]:
    return re.findall(r'class="tile [^"]*"[^>]*data-node="([^"]+)"', html)


def test_each_pool_counts_its_nodes_by_state_gpus_and_spares(web, operator, team, cluster, big):
    job = make_job(team, big, pool=big.pools.get(name="h100"))
    run(job, list(Node.objects.filter(pool__name="h100", is_spare=False).order_by("name")[:2]))
    resp = web(operator).get("/fleet/")
    assert resp.status_code == 200
    view = next(c for c in resp.context["clusters"] if c.cluster.name == "gpu-b")
    pools = {p.pool.name: p.counts for p in view.pools}
    assert dict(pools["h100"].state_counts) == {
        "ready": 115, "busy": 2, "spare": 3, "provisioning": 0, "cordoned": 0,
        "draining": 0, "failed": 0}
    assert (pools["h100"].gpus_total, pools["h100"].gpus_in_use, pools["h100"].gpus_free,
            pools["h100"].spares_ready, pools["h100"].spares_total) == (960, 16, 920, 3, 3)
    assert dict(pools["a10"].state_counts) == {
        "ready": 0, "busy": 0, "spare": 0, "provisioning": 1, "cordoned": 1,
        "draining": 1, "failed": 1}  # the terminated node is not counted
    assert (pools["a10"].gpus_cordoned, pools["a10"].attention) == (3, 3)
    assert resp.context["totals"] == {"gpus_total": 10 + 964, "gpus_in_use": 16,
                                      "gpus_free": 8 + 920, "gpus_cordoned": 3,
                                      "spares_ready": 4, "spares_total": 4}
    html = resp.content.decode()
    assert '<tr data-pool="h100">' in html and 'data-count="busy"><a href=' in html


def test_the_attention_list_holds_only_nodes_someone_should_look_at(
        web, owner, cluster, big):
    xid(Node.objects.get(name="cpu-a-3"))  # ready, but an open critical event
    xid(Node.objects.get(name="cpu-a-2"), handled=True)  # handled: fine again
    Node.objects.filter(name="h100-00007").update(replace_failures=2,
                                                  replace_error="quota exceeded")
    resp = web(owner).get("/fleet/")
    listed = {n.name: n.health for n in resp.context["attention"]}
    assert listed == {"cpu-a-3": "critical", "a10-0": "ok", "a10-1": "ok", "a10-2": "ok",
                      "h100-00007": "ok"}
    html = resp.content.decode()
    assert '<tr data-attention-node="a10-2">' in html and "because failed" in html
    assert "quota exceeded" in html and "a10-3" not in re.findall(
        r'data-attention-node="([^"]+)"', html)


def test_the_attention_list_is_capped_and_links_to_all_of_them(web, operator, cluster, big):
    Node.objects.filter(pool__name="h100").update(state="cordoned", state_changed_at=timezone.now())
    client = web(operator)
    resp = client.get("/fleet/")
    assert len(resp.context["attention"]) == ATTENTION_SHOWN
    assert resp.context["counts"].attention == 123
    assert f"{ATTENTION_SHOWN} of 123 shown" in resp.content.decode()
    every = client.get("/fleet/?state=attention")
    assert every.context["page"].paginator.count == 123


def test_tiles_come_a_page_at_a_time(web, operator, cluster, big):
    client = web(operator)
    first = client.get("/fleet/")
    names = tile_names(first.content.decode())
    assert len(names) == TILES_PER_PAGE
    assert names[:5] == [f"cpu-a-{i}" for i in range(5)]  # by cluster, pool, name
    second = tile_names(client.get("/fleet/?page=2").content.decode())
    assert len(second) == 129 - TILES_PER_PAGE and not set(second) & set(names)
    assert "nodes 1–100 of 129" in first.content.decode()
    assert 'href="?page=2">next' in first.content.decode()


def test_tiles_narrow_by_state_cluster_and_pool(web, operator, team, cluster, big):
    client = web(operator)
    assert tile_names(client.get("/fleet/?state=failed").content.decode()) == ["a10-2"]
    assert tile_names(client.get("/fleet/?state=spare").content.decode()) == [
        "cpu-a-4", "h100-00117", "h100-00118", "h100-00119"]
    pool = tile_names(client.get("/fleet/?cluster=gpu-b&pool=a10").content.decode())
    assert pool == ["a10-0", "a10-1", "a10-2", "a10-3"]
    run(make_job(team, cluster), list(Node.objects.filter(name__in=["cpu-a-0", "cpu-a-1"])))
    resp = client.get("/fleet/?state=busy&page=1")
    assert tile_names(resp.content.decode()) == ["cpu-a-0", "cpu-a-1"]
    live = client.get(resp.context["live_url"]).json()["fragments"]["fleet-clusters"]
    assert tile_names(live) == ["cpu-a-0", "cpu-a-1"]  # the live twin keeps the filter


def test_an_unknown_state_filter_is_a_400_naming_the_choices(web, operator, cluster):
    for url in ("/fleet/?state=melted", "/fleet/live/?state=melted"):
        resp = web(operator).get(url)
        assert resp.status_code == 400
        assert "melted" in resp.content.decode() and "attention" in resp.content.decode()


def queries(client, url) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(url)
    assert resp.status_code == 200
    return len(ctx.captured_queries), len(resp.content)


def test_the_page_takes_the_same_queries_and_size_for_a_fleet_ten_times_larger(
        web, operator, team, cluster, big):
    client = web(operator)
    pool = big.pools.get(name="h100")
    Node.objects.filter(pool=pool, name__lt="h100-00060").update(state="cordoned")
    small = queries(client, "/fleet/")
    add_nodes(big, pool, 1200, start=1000)
    Node.objects.filter(name__in=[f"h100-{i:05d}" for i in range(1000, 1100)]).update(
        state="cordoned")
    large = queries(client, "/fleet/")
    assert large[0] == small[0]
    assert large[1] < small[1] * 1.1  # a page of tiles either way; the attention list is capped


def test_a_pool_whose_launches_fail_says_so_with_the_providers_message(web, operator, big):
    NodePool.objects.filter(cluster=big, name="h100").update(
        scaling_failures=3, scaling_failed_at=timezone.now(),
        scaling_error="Failed: We currently do not have sufficient p5.48xlarge capacity")
    html = web(operator).get("/fleet/").content.decode()
    (row,) = re.findall(r'<tr data-pool="h100">.*?</tr>', html, re.S)
    assert "launches failing (3 in a row)" in row
    assert "sufficient p5.48xlarge capacity" in row
    (other,) = re.findall(r'<tr data-pool="a10">.*?</tr>', html, re.S)
    assert "data-scaling-failed" not in other
