from clusters.models import Node, NodeEvent

from .factories import make_job, rich_job, run, xid


def test_an_anonymous_visitor_is_sent_to_log_in(client, cluster):
    resp = client.get("/fleet/")
    assert resp.status_code == 302
    assert resp["Location"].startswith("/login/")


def test_home_leads_to_the_fleet(web, owner):
    resp = web(owner).get("/")
    assert resp.status_code == 302 and resp["Location"] == "/fleet/"


def test_the_fleet_counts_gpus_in_use_free_cordoned_and_spares(web, operator, team, cluster):
    rich_job(team, cluster)  # runs on nodes 0 and 2; node 1 was cordoned after an XID
    resp = web(operator).get("/fleet/")
    assert resp.status_code == 200
    totals = resp.context["totals"]
    assert totals == {"gpus_total": 10, "gpus_in_use": 4, "gpus_free": 2,
                      "gpus_cordoned": 2, "spares_ready": 1, "spares_total": 1}
    tiles = {t.node.name: t.css for t in resp.context["clusters"][0].tiles}
    assert tiles == {"cpu-a-0": "busy", "cpu-a-1": "cordoned", "cpu-a-2": "busy",
                     "cpu-a-3": "ready", "cpu-a-4": "spare"}
    html = resp.content.decode()
    assert 'class="tile state-cordoned health-ok"' in html
    assert "XID 79: GPU has fallen off the bus" in html


def test_an_open_critical_health_event_marks_the_node_tile(web, owner, cluster):
    xid(Node.objects.get(name="cpu-a-3"))
    resp = web(owner).get("/fleet/")
    tile = next(t for t in resp.context["clusters"][0].tiles if t.node.name == "cpu-a-3")
    assert tile.health == "critical"
    assert 'data-node="cpu-a-3"' in resp.content.decode()


def test_the_live_endpoint_follows_a_cordon_without_a_reload(web, operator, cluster):
    client = web(operator)
    before = client.get("/fleet/live/").json()["fragments"]
    assert 'data-stat="cordoned">0<' in before["fleet-totals"]
    Node.objects.get(name="cpu-a-3").cordon("maintenance", actor="user:opal")
    after = client.get("/fleet/live/").json()["fragments"]
    assert 'data-stat="cordoned">2<' in after["fleet-totals"]
    assert 'state-cordoned' in after["fleet-clusters"]


def test_a_member_sees_the_fleet_but_not_other_teams_jobs_on_its_tiles(
        web, outsider, team, cluster):
    job = make_job(team, cluster, name="secret-run")
    run(job, list(cluster.nodes.filter(is_spare=False))[:2])
    html = web(outsider).get("/fleet/").content.decode()
    # The tile shows the node is busy, not whose job is on it.
    assert "secret-run" not in html
    assert html.count("state-busy") >= 2
    assert NodeEvent.objects.count() == 0
