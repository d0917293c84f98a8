from jobs.goodput import summarize
from jobs.goodput.models import GoodputEntry

from .factories import goodput, make_job, rich_job, run

Category = GoodputEntry.Category


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
    assert round(hours["held"], 3) == 1.67
    assert round(hours["goodput_pct"], 1) == 89.8


def test_it_shows_gpu_hours_held_by_every_job_of_the_team_and_lost_to_each_cause(
        web, owner, team, other_team, cluster):
    """Held is every category the ledger counts as holding GPUs (all but
    queueing); lost is held less productive; both agree with the ledger's
    own summary, whatever categories it books."""
    first = rich_job(team, cluster)
    second = make_job(team, cluster, name="second", num_nodes=1, gpus_per_node=2)
    attempt = run(second, [cluster.nodes.get(name="cpu-a-3")])
    goodput(second, attempt, Category.PRODUCTIVE, 0.4, "p2")
    goodput(second, attempt, Category.HANG, 0.25, "h2")
    goodput(second, None, Category.QUEUED, 3.0, "q2")  # waiting holds no GPUs
    theirs = make_job(other_team, cluster, name="theirs")
    goodput(theirs, None, Category.PRODUCTIVE, 9.0, "p3")

    resp = web(owner).get("/teams/vision/")
    hours = resp.context["hours"]
    assert round(hours["held"], 3) == 2.32  # 1.5 + 0.4 productive, 0.17 + 0.25 lost
    assert round(hours["productive"], 3) == 1.9
    assert round(hours["lost"], 3) == 0.42
    summary = summarize(GoodputEntry.objects.filter(job__in=[first, second]))
    assert hours["goodput_pct"] == 100 * summary["goodput_ratio"]
    held_s = sum(v["gpu_seconds"] for k, v in summary["categories"].items() if k != "queued")
    assert abs(hours["held"] * 3600 - held_s) < 1e-6
    rows = {r["category"]: r for r in hours["rows"]}
    assert round(rows["hang"]["gpu_hours"], 3) == 0.25
    assert rows["queued"]["gpu_hours"] == 0 and rows["queued"]["share"] is None
    html = resp.content.decode()
    assert 'data-hours="held">2.32<' in html and 'data-hours="lost">0.42<' in html
    assert "Hang before detection" in html
    # The chart plots GPU-hours only: queueing is a wait, not a bar.
    assert "queued" not in {r["category"] for r in web(owner).get(
        "/teams/vision/live/").json()["goodput"]}
    listed = web(owner).get("/teams/").content.decode()
    assert "2.32 GPU-h held" in listed and "0.42 lost" in listed


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
