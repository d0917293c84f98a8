from .factories import make_job, rich_job, run


def test_the_team_page_shows_quota_usage_against_limits(web, owner, team, cluster):
    job = make_job(team, cluster, num_nodes=1, gpus_per_node=2)
    run(job, [cluster.nodes.get(name="cpu-a-0")])
    resp = web(owner).get("/teams/vision/")
    assert resp.status_code == 200
    (quota,) = resp.context["quotas"]
    assert (quota["gpus_used"], quota["gpus_limit"], quota["running_jobs"]) == (2, 4, 1)
    assert "<strong>2</strong> / 4" in resp.content.decode()


def test_the_team_page_splits_gpu_hours_into_productive_and_lost(web, owner, team, cluster):
    rich_job(team, cluster)
    hours = web(owner).get("/teams/vision/").context["hours"]
    assert round(hours["productive"], 3) == 1.5
    assert round(hours["lost"], 3) == 0.17  # rollback 0.1 + restart 0.05 + checkpoint 0.02
    assert round(hours["goodput_pct"], 1) == 89.8


def test_an_outsider_gets_404_for_another_team(web, outsider, team):
    assert web(outsider).get("/teams/vision/").status_code == 404
    assert web(outsider).get("/teams/vision/live/").status_code == 404


def test_the_team_list_shows_only_the_member_s_teams(web, outsider, team, other_team):
    resp = web(outsider).get("/teams/")
    assert [t["team"].name for t in resp.context["teams"]] == ["speech"]


def test_the_team_live_endpoint_sends_the_ledger(web, operator, team, cluster):
    rich_job(team, cluster)
    data = web(operator).get("/teams/vision/live/").json()
    assert {g["category"] for g in data["goodput"]} == {
        "productive", "rollback", "restart", "checkpoint"}
    assert "gpt-tiny" in data["fragments"]["job-rows"]


def test_plotly_is_served_from_the_project_s_static_files(client):
    resp = client.get("/static/frontend/plotly.min.js")
    assert resp.status_code == 200
    body = b"".join(resp.streaming_content) if resp.streaming else resp.content
    assert b"plotly" in body[:2000].lower() and len(body) > 1_000_000
