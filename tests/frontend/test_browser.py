"""The console in a real headless Chromium against a live server: log in, see
the fleet, follow a job submitted through the API, read its charts, cancel it,
log out. Every page a test visits is saved to test-artifacts/screenshots/."""

import pytest
import requests
from django.conf import settings
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from accounts.models import ApiToken
from checkpoints.models import Checkpoint
from jobs.models import JobAttempt, Phase, TrainingJob
from tests.support.waiting import eventually

from .browser import shot
from .factories import checkpoint, metrics, rich_job, run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(180)]


def _submit(live_server, user, **spec) -> int:
    _, raw = ApiToken.issue(user, "browser-test")
    body = {"name": "api-submitted", "team": "vision", "cluster": "cpu-a", "num_nodes": 2,
            "gpus_per_node": 2, "hyperparameters": {"model": "nano", "max_steps": 300}}
    body.update(spec)
    resp = requests.post(f"{live_server.url}/api/v1/jobs/", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {raw}"})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_an_operator_logs_in_and_sees_the_fleet(open_page, operator, team, cluster):
    rich_job(team, cluster)
    page = open_page(operator)
    page.wait_for_selector(".node-grid .tile")
    assert page.locator(".tile").count() == 5
    assert page.locator(".tile.state-busy").count() == 2
    assert page.locator(".tile.state-cordoned").count() == 1
    assert page.locator(".tile.state-spare").count() == 1
    assert page.inner_text('[data-stat="in-use"]') == "4"
    assert "XID 79" in page.inner_text("#fleet-health")
    shot(page, "fleet")


def test_a_job_submitted_through_the_api_appears_charts_and_can_be_cancelled(
        open_page, live_server, owner, team, cluster):
    job_id = _submit(live_server, owner)
    page = open_page(owner)
    page.goto(live_server.url + "/jobs/")
    row = page.locator(f'tr[data-job="{job_id}"]')
    assert "api-submitted" in row.inner_text()
    assert row.locator(".pill").first.inner_text() == "pending"

    job = TrainingJob.objects.get(pk=job_id)
    attempt = run(job, list(cluster.nodes.filter(is_spare=False))[:2])
    metrics(job, attempt, "loss", range(1, 250))
    metrics(job, attempt, "val_loss", range(25, 250, 25), value=lambda s: 3.2 - s / 200)
    metrics(job, attempt, "tokens_per_s", range(1, 250), value=lambda s: 5000.0 + s % 13)
    checkpoint(job, attempt, 100)
    checkpoint(job, attempt, 200)
    # The list follows the phase change without a reload.
    expect(page.locator(f'tr[data-job="{job_id}"] .pill').first).to_have_text("running")
    shot(page, "jobs")

    page.goto(f"{live_server.url}/jobs/{job_id}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace path.js-line")
    loss_paths = page.locator("#chart-loss .scatterlayer .trace path.js-line")
    assert loss_paths.count() >= 2  # loss and validation loss
    # Plotly simplifies collinear stretches, so count segments loosely and
    # check the trace itself carries every point of the series.
    assert loss_paths.first.get_attribute("d").count("L") > 20
    assert page.evaluate("document.getElementById('chart-loss').data[0].x.length") == 249
    assert page.locator("#chart-throughput .scatterlayer .trace").count() >= 1
    assert page.locator("#chart-loss .shapelayer path").count() == 2  # two checkpoint marks
    shot(page, "job")

    page.once("dialog", lambda d: d.accept())
    page.click("#cancel-job")
    page.wait_for_selector(".messages li.success")
    job.refresh_from_db()
    assert job.cancel_requested_at is not None
    assert job.events.filter(kind="CancelRequested", actor="user:olivia").exists()
    assert page.is_disabled("#cancel-job")
    shot(page, "job-cancelled")


def test_an_outsider_cannot_see_the_job(open_page, live_server, owner, outsider, team, cluster):
    job_id = _submit(live_server, owner)
    page = open_page(outsider)
    resp = page.goto(f"{live_server.url}/jobs/{job_id}/")
    assert resp.status == 404
    assert "Not found" in page.inner_text("main")
    assert page.locator(".topbar .who").inner_text() == "oscar"  # still inside the console
    shot(page, "outsider-404")
    page.goto(live_server.url + "/jobs/")
    assert "api-submitted" not in page.inner_text("#job-rows")
    shot(page, "outsider-jobs")


def test_the_job_page_marks_restarts_and_updates_live(open_page, live_server, owner, team,
                                                      cluster):
    job = rich_job(team, cluster)
    page = open_page(owner)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace path.js-line")
    assert "attempt 2" in page.text_content("#chart-loss .annotation")
    assert page.text_content("#job-phase") == "running"
    job.transition(Phase.SUCCEEDED, reason="Finished", message="all ranks exited 0")
    expect(page.locator("#job-phase")).to_have_text("succeeded")
    assert "Finished" in page.inner_text("#job-events")
    # The actions follow the phase too: nothing left to cancel.
    page.wait_for_selector("#cancel-job:disabled")
    shot(page, "job-restarted")


def test_node_and_team_pages_render(open_page, live_server, operator, team, cluster):
    rich_job(team, cluster)
    page = open_page(operator)
    page.click('.tile[data-node="cpu-a-1"]')
    page.wait_for_selector("#node-state")
    assert page.text_content("#node-state") == "cordoned"
    assert "XID 79 on gpu 0" in page.inner_text("#node-events")
    shot(page, "node")
    page.goto(f"{live_server.url}/teams/vision/")
    page.wait_for_selector("#chart-goodput .barlayer .trace")
    assert "1.50" in page.inner_text('[data-hours="productive"]')
    assert "1.67" in page.inner_text('[data-hours="held"]')
    shot(page, "team")
    page.click(".topbar nav >> text=Teams")
    page.wait_for_selector('.team-card[data-team="vision"]')
    assert "1.67 GPU-h held" in page.inner_text('.team-card[data-team="vision"]')
    shot(page, "teams")


def test_a_long_job_s_page_shows_its_newest_rows_and_links_to_the_rest(
        open_page, live_server, owner, team, cluster):
    job = rich_job(team, cluster)
    attempt = job.attempts.get(number=2)
    Checkpoint.objects.bulk_create([
        Checkpoint(job=job, attempt=attempt, step=s, uri=f"file:///ckpt/step-{s}",
                   bytes=40 << 20, save_seconds=2.1, blocking_seconds=0.04,
                   state=Checkpoint.State.DELETED if s < 400 else Checkpoint.State.VERIFIED)
        for s in range(210, 900, 10)
    ])
    JobAttempt.objects.bulk_create([
        JobAttempt(job=job, number=n, state=JobAttempt.State.FAILED, failure_class="transient",
                   failure_reason="NCCL watchdog timeout", exit_code=1)
        for n in range(3, 16)
    ])
    page = open_page(owner)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace path.js-line")
    assert page.locator("#job-checkpoints tr[data-step]").count() == 20
    assert page.locator("#job-attempts tr[data-attempt]").count() == 10
    assert "Newest 20 of 54 kept; 19 deleted by retention" in page.inner_text(
        "#checkpoints-more")
    shot(page, "job-long")
    page.click("#checkpoints-more a")
    page.wait_for_selector("h1:has-text('Checkpoints')")
    assert page.locator("tr[data-step]").count() == 50
    assert page.locator("[data-restart]").count() > 0
    shot(page, "job-checkpoints")
    page.goto(f"{live_server.url}/jobs/{job.pk}/attempts/")
    assert page.locator("tr[data-attempt]").count() == 15
    shot(page, "job-attempts")


def test_logging_out_ends_the_session_for_pages_and_the_api(open_page, live_server, owner):
    page = open_page(owner)
    me = page.request.get(live_server.url + "/api/v1/me/")
    assert me.status == 200 and me.json()["username"] == "olivia"
    cookie = next(c["value"] for c in page.context.cookies()
                  if c["name"] == settings.SESSION_COOKIE_NAME)

    page.click("form.logout button")
    page.wait_for_url(live_server.url + "/login/")
    assert page.locator("input[name=username]").is_visible()
    assert page.inner_text(".messages li.info") == "You have logged out."
    shot(page, "logged-out")
    page.goto(live_server.url + "/jobs/")
    assert page.url == live_server.url + "/login/?next=/jobs/"
    assert page.request.get(live_server.url + "/api/v1/me/").status == 401
    # The server forgot the session: the old cookie, replayed, opens nothing.
    assert not Session.objects.filter(session_key=cookie).exists()
    old = {settings.SESSION_COOKIE_NAME: cookie}
    assert requests.get(live_server.url + "/api/v1/me/", cookies=old, timeout=10).status_code \
        == 401
    resp = requests.get(live_server.url + "/fleet/", cookies=old, timeout=10,
                        allow_redirects=False)
    assert resp.status_code == 302 and resp.headers["Location"] == "/login/?next=/fleet/"


def test_a_wrong_password_is_refused_on_the_login_page(chromium, live_server, owner):
    ctx = chromium.new_context(viewport={"width": 1440, "height": 1000})
    try:
        page = ctx.new_page()
        page.goto(live_server.url + "/fleet/")
        assert page.url == live_server.url + "/login/?next=/fleet/"
        page.fill("input[name=username]", "olivia")
        page.fill("input[name=password]", "not-her-password")
        page.click("form button[type=submit]")
        page.wait_for_selector(".login .error")
        assert "didn't match" in page.inner_text(".login .error")
        shot(page, "login-error")
    finally:
        ctx.close()


def test_restart_labels_never_overlap_and_throughput_breaks_at_restarts(
        open_page, live_server, owner, team, cluster):
    job = rich_job(team, cluster, points=1000)
    nodes = list(cluster.nodes.filter(is_spare=False).order_by("name"))[:2]
    # Restarts crowded together, as a flapping node makes them.
    for number, step in enumerate([505, 510, 515, 520, 525, 700, 705], start=3):
        JobAttempt.objects.filter(job=job).exclude(state__in=JobAttempt.ENDED).update(
            state=JobAttempt.State.FAILED)
        JobAttempt.objects.create(job=job, number=number, state="running", resume_step=step)
    assert nodes
    page = open_page(owner)
    page.set_viewport_size({"width": 900, "height": 900})
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-loss .annotation")
    boxes = page.evaluate("""() => [...document.querySelectorAll('#chart-loss .annotation')]
        .map((a) => a.getBoundingClientRect())
        .map((r) => [r.left, r.top, r.right, r.bottom])""")
    assert len(boxes) >= 2
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, (a, b)
    ys = page.evaluate("document.getElementById('chart-throughput').data[0].y")
    assert None in ys
    shot(page, "job-crowded-restarts")


def test_an_moe_job_s_page_draws_its_expert_load_as_a_heatmap_by_layer(
        open_page, live_server, owner, team, cluster):
    job = rich_job(team, cluster)
    attempt = job.attempts.get(number=2)
    steps = range(250, 300, 2)
    for layer in (0, 1):
        for expert in range(4):
            # Layer 1's expert 3 takes more and more of the tokens.
            metrics(job, attempt, f"moe/layer{layer}/expert{expert}_load", steps,
                    value=lambda s, e=expert, lay=layer: 0.25 + (0.001 * (s - 250) * (
                        1 if e == 3 else -1 / 3) if lay == 1 else 0.0))
        metrics(job, attempt, f"moe/layer{layer}/dropped", steps, value=lambda s: 0.02)
    dense = rich_job(team, cluster)
    page = open_page(owner)

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-moe .hm")
    assert page.is_visible("#moe-card")
    data = page.evaluate("document.getElementById('chart-moe').data[0]")
    assert data["type"] == "heatmap" and len(data["z"]) == 4 and len(data["x"]) == 25
    assert data["z"][3][-1] == pytest.approx(0.25)
    assert "2.0%" in page.inner_text("#moe-dropped")
    page.select_option("#moe-layer", "1")
    eventually(lambda: page.evaluate(
        "document.getElementById('chart-moe').data[0].z[3].slice(-1)[0]") > 0.29,
        timeout=15, interval=0.2, what="the heatmap redrawn for layer 1")
    shot(page, "job-moe")

    page.goto(f"{live_server.url}/jobs/{dense.pk}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace path.js-line")
    assert not page.is_visible("#moe-card")
