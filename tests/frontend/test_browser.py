"""The console in a real headless Chromium against a live server: log in, see
the fleet, follow a job submitted through the API, read its charts, cancel it.
Screenshots of each page go to test-artifacts/screenshots/."""

import pytest
import requests

from accounts.models import ApiToken
from jobs.models import Phase, TrainingJob

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
    page.wait_for_function(
        f"document.querySelector('tr[data-job=\"{job_id}\"] .pill').textContent === 'running'")
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


def test_an_outsider_cannot_see_the_job(open_page, live_server, owner, outsider, team, cluster):
    job_id = _submit(live_server, owner)
    page = open_page(outsider)
    resp = page.goto(f"{live_server.url}/jobs/{job_id}/")
    assert resp.status == 404
    page.goto(live_server.url + "/jobs/")
    assert "api-submitted" not in page.inner_text("#job-rows")


def test_the_job_page_marks_restarts_and_updates_live(open_page, live_server, owner, team,
                                                      cluster):
    job = rich_job(team, cluster)
    page = open_page(owner)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace path.js-line")
    assert "attempt 2" in page.text_content("#chart-loss .annotation")
    assert page.text_content("#job-phase") == "running"
    job.transition(Phase.SUCCEEDED, reason="Finished", message="all ranks exited 0")
    page.wait_for_function("document.querySelector('#job-phase').textContent === 'succeeded'")
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
    shot(page, "team")
