import pytest

from clusters.models import Cluster, Node, NodeEvent
from jobs.worker_api.tokens import issue as issue_token

from .factories import make_job, rich_job, run, xid


def test_the_node_page_shows_why_it_was_cordoned_and_the_jobs_that_ran_there(
        web, operator, team, cluster):
    job = rich_job(team, cluster)
    node = Node.objects.get(name="cpu-a-1")
    resp = web(operator).get(f"/nodes/{node.pk}/")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "XID 79 on gpu 0" in html  # the NodeEvent's reason
    assert "XID 79: GPU has fallen off the bus" in html  # the health history
    assert [p.attempt.job_id for p in resp.context["placements"]] == [job.pk]
    # Only the moves a cordoned node allows are offered.
    offered = [a for a, *_ in resp.context["node_actions"]]
    assert offered == ["uncordon", "drain", "replace", "return"]
    assert 'data-action="uncordon"' in html and 'id="fault-form"' in html


def test_a_member_sees_no_actions_and_no_other_team_s_jobs(web, outsider, team, cluster):
    job = make_job(team, cluster, name="secret-run")
    node = cluster.nodes.get(name="cpu-a-0")
    run(job, [node])
    resp = web(outsider).get(f"/nodes/{node.pk}/")
    html = resp.content.decode()
    assert list(resp.context["placements"]) == []
    assert "secret-run" not in html
    assert "data-action=" not in html and "fault-form" not in html


def test_only_operators_may_cordon_drain_or_replace(web, owner, cluster):
    node = cluster.nodes.get(name="cpu-a-0")
    for action in ("cordon", "drain", "replace", "uncordon"):
        assert web(owner).post(f"/nodes/{node.pk}/{action}/").status_code == 403
    assert web(owner).post(f"/nodes/{node.pk}/fault/", {"kind": "xid"}).status_code == 403
    node.refresh_from_db()
    assert node.state == Node.State.READY and node.replace_requested_at is None
    assert not NodeEvent.objects.exists()


def test_an_operator_cordons_then_uncordons_a_node_with_a_reason(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-0")
    client = web(operator)
    client.post(f"/nodes/{node.pk}/cordon/", {"reason": "fan noise"})
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED
    event = node.events.get()
    assert (event.from_state, event.to_state, event.actor) == ("ready", "cordoned", "user:opal")
    assert event.reason == "cordoned by opal: fan noise"
    resp = client.post(f"/nodes/{node.pk}/cordon/", follow=True)
    assert node.events.count() == 1 and "nothing to do" in resp.content.decode()
    client.post(f"/nodes/{node.pk}/uncordon/")
    node.refresh_from_db()
    assert node.state == Node.State.READY and node.events.count() == 2


def test_replace_asks_the_reconciler_once(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-2")
    client = web(operator)
    client.post(f"/nodes/{node.pk}/replace/")
    client.post(f"/nodes/{node.pk}/replace/")
    node.refresh_from_db()
    assert node.replace_requested_at is not None
    assert list(node.events.values_list("reason", flat=True)) == [
        "replacement requested by opal"]


def test_an_illegal_move_is_shown_and_changes_nothing(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-0")
    Node.objects.filter(pk=node.pk).update(state=Node.State.TERMINATED)
    resp = web(operator).post(f"/nodes/{node.pk}/drain/", follow=True)
    assert "Cannot drain cpu-a-0: it is terminated" in resp.content.decode()
    assert not node.events.exists()


def test_an_unknown_action_or_fault_is_refused(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-0")
    client = web(operator)
    assert client.post(f"/nodes/{node.pk}/explode/").status_code == 404
    resp = client.post(f"/nodes/{node.pk}/fault/", {"kind": "meteor"}, follow=True)
    assert "Unknown fault" in resp.content.decode()


def test_a_fault_on_a_cluster_that_is_not_local_is_refused(web, operator, cluster):
    Cluster.objects.filter(pk=cluster.pk).update(provider=Cluster.Provider.KUBERNETES)
    node = cluster.nodes.get(name="cpu-a-0")
    resp = web(operator).post(f"/nodes/{node.pk}/fault/", {"kind": "xid"}, follow=True)
    assert "fault injection needs a local cluster" in resp.content.decode()
    assert "fault-form" not in resp.content.decode()


def test_the_node_live_endpoint_follows_new_health_events(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-3")
    client = web(operator)
    assert "fallen off the bus" not in client.get(f"/nodes/{node.pk}/live/").json()[
        "fragments"]["node-health"]
    xid(node)
    assert "fallen off the bus" in client.get(f"/nodes/{node.pk}/live/").json()[
        "fragments"]["node-health"]


def test_a_node_running_a_job_shows_when_its_ranks_last_beat(web, operator, team, cluster):
    from tests.api_factories import worker_client

    node = Node.objects.get(name="cpu-a-0")
    attempt = run(make_job(team, cluster), [node])
    before = web(operator).get(f"/nodes/{node.pk}/").content.decode()
    assert 'Last heartbeat</span>—' in before
    resp = worker_client(issue_token(attempt)).post(
        f"/api/v1/worker/attempts/{attempt.pk}/heartbeat",
        {"rank": 0, "node": "cpu-a-0", "step": 3}, format="json")
    assert resp.status_code == 200, resp.content
    after = web(operator).get(f"/nodes/{node.pk}/").content.decode()
    assert 'Last heartbeat</span>—' not in after
    assert "ago" in after.split("Last heartbeat</span>", 1)[1].split("</div>", 1)[0]


def test_a_nul_in_a_cordon_reason_is_dropped_not_a_server_error(web, operator, cluster):
    node = cluster.nodes.get(name="cpu-a-0")
    resp = web(operator).post(f"/nodes/{node.pk}/cordon/", {"reason": "fan\x00 noise"})
    assert resp.status_code == 302
    assert node.events.get().reason == "cordoned by opal: fan noise"


@pytest.mark.usefixtures("fleet_dirs")
def test_a_replaced_node_says_which_spare_took_its_place_and_which_machine_is_new(
        web, operator):
    from django.utils import timezone

    from clusters.reconcile import reconcile_cluster_unlocked
    from clusters.reconcile.replacement import take_out
    from tests.fleet_helpers import later, memory_cluster

    cluster = memory_cluster(size=2, spares=1)
    node = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    spare = Node.objects.get(cluster=cluster, is_spare=True)
    now = timezone.now()
    take_out(node, "hardware: killed", {}, now, replace_reason="replaced after a kill")
    reconcile_cluster_unlocked(cluster.id, later(now, 1))
    made = Node.objects.exclude(pk__in=[node.pk, spare.pk]).get(
        cluster=cluster, name__in=[e.evidence.get("new") for e in node.events.all()])

    html = web(operator).get(f"/nodes/{node.pk}/").content.decode()
    taken = html.split('class="node-replaced-by"', 1)[1].split("</div>", 1)[0]
    new = html.split('id="node-provider-made"', 1)[1].split("</div>", 1)[0]
    assert spare.name in taken and "promoted" in taken and made.name not in taken
    assert made.name in new and "provider" in new and spare.name not in new
    assert "Replaced by" not in html
    # The spare's own page says whose place it took.
    spare_html = web(operator).get(f"/nodes/{spare.pk}/").content.decode()
    assert node.name in spare_html.split('id="node-replaces"', 1)[1].split("</div>", 1)[0]


def test_the_favicon_is_served_on_every_page(web, operator, client):
    resp = client.get("/favicon.ico", follow=True)
    assert resp.status_code == 200
    body = b"".join(resp.streaming_content) if resp.streaming else resp.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO file
    html = web(operator).get("/fleet/").content.decode()
    assert 'rel="icon"' in html and "favicon.ico" in html
