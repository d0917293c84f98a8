"""The comparison page: two jobs' curves drawn in real Chromium, their
hyperparameters side by side with the differences marked; the URL is the
state; scoped like the job pages; bad input is 400."""

import pytest
from django.test import Client
from django.utils import timezone

from jobs.metrics import ingest
from jobs.metrics.compare import MAX_JOBS

from .browser import shot
from .factories import make_job, run


def timed(job, attempt, name, steps, value=lambda s: 4.0 / (1 + s / 50), every_s=2.0):
    """Points through ingest, a step every `every_s` seconds (the factories'
    points all share one time, which would draw a wall-time chart as a line
    at zero)."""
    start = timezone.now().timestamp() - 3600
    rows = [(0, name, s, value(s), start + s * every_s) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))


def two_runs(team, cluster, user=None):
    nodes = list(cluster.nodes.filter(is_spare=False).order_by("name"))
    a = make_job(team, cluster, user, name="lr-3e-4",
                 hyperparameters={"model": "nano", "max_steps": 300, "lr": 3e-4})
    b = make_job(team, cluster, user, name="lr-1e-3",
                 hyperparameters={"model": "nano", "max_steps": 300, "lr": 1e-3})
    timed(a, run(a, nodes[:2]), "loss", range(1, 201))
    attempt = run(b, nodes[2:4])
    timed(b, attempt, "loss", range(1, 151), value=lambda s: 3.0 / (1 + s / 30), every_s=5.0)
    timed(b, attempt, "grad_norm", range(1, 151), value=lambda s: 1.0)
    return a, b


@pytest.mark.django_db
def test_the_page_shows_the_diff_and_the_union_of_metrics(web, owner, team, cluster):
    a, b = two_runs(team, cluster, owner)
    resp = web(owner).get(f"/compare/?jobs={a.pk},{b.pk}")
    assert resp.status_code == 200
    html = resp.content.decode()
    assert '<tr class="differs" data-key="hyperparameters.lr">' in html
    assert '<tr class="same" data-key="hyperparameters.model">' in html
    assert '<option value="grad_norm">' in html and '<option value="loss" selected>' in html
    assert 'id="compare-data"' in html


@pytest.mark.django_db
def test_a_picker_s_repeated_jobs_redirect_to_the_shareable_url(web, owner, team, cluster):
    a, b = two_runs(team, cluster, owner)
    resp = web(owner).get(f"/compare/?jobs={a.pk}&jobs={b.pk}&x=time&metric=loss")
    assert resp.status_code == 302
    assert resp["Location"] == f"/compare/?jobs={a.pk}%2C{b.pk}&metric=loss&x=time"


@pytest.mark.django_db
def test_another_team_s_job_is_not_found_an_operator_sees_it(web, owner, outsider, operator,
                                                              team, cluster, other_team):
    a, _ = two_runs(team, cluster, owner)
    theirs = make_job(other_team, cluster, outsider, name="theirs")
    assert web(owner).get(f"/compare/?jobs={a.pk},{theirs.pk}").status_code == 404
    assert web(operator).get(f"/compare/?jobs={a.pk},{theirs.pk}").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(("query", "field"), [
    ("jobs=x", "jobs"), ("jobs=" + ",".join(map(str, range(1, MAX_JOBS + 2))), "jobs"),
    ("jobs=1&x=epoch", "x"), ("jobs=1&metric=" + "m" * 65, "metric"),
])
def test_bad_input_is_a_400_page_naming_the_field(web, owner, query, field):
    resp = web(owner).get(f"/compare/?{query}")
    assert resp.status_code == 400
    assert f'id="compare-error">{field}:' in resp.content.decode()


@pytest.mark.django_db
def test_without_jobs_the_page_offers_a_picker(web, owner, team, cluster):
    a, b = two_runs(team, cluster, owner)
    resp = web(owner).get("/compare/")
    assert resp.status_code == 200
    assert f'value="{a.pk}" aria-label="compare job {a.pk}"' in resp.content.decode()
    assert Client().get("/compare/").status_code == 302  # to the login page


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_chromium_draws_two_jobs_curves_picked_from_the_jobs_list(open_page, live_server,
                                                                  owner, team, cluster):
    a, b = two_runs(team, cluster, owner)
    page = open_page(owner)
    page.goto(live_server.url + "/jobs/")
    page.check(f'input[aria-label="compare job {a.pk}"]')
    page.check(f'input[aria-label="compare job {b.pk}"]')
    page.click("#compare-selected button")
    # The list is newest first, and so is the comparison it asks for.
    page.wait_for_url(f"{live_server.url}/compare/?jobs={b.pk}%2C{a.pk}")
    page.wait_for_selector("#chart-compare .scatterlayer .trace path.js-line")

    assert page.locator("#chart-compare .scatterlayer .trace").count() == 2
    names = page.evaluate("document.getElementById('chart-compare').data.map(t => t.name)")
    assert names == [f"#{b.pk} lr-1e-3", f"#{a.pk} lr-3e-4"]
    lengths = page.evaluate("document.getElementById('chart-compare').data.map(t => t.x.length)")
    assert lengths == [150, 200]
    assert page.locator(".legend .traces").count() == 2
    assert page.locator("#compare-params tr.differs").first.get_attribute(
        "data-key") == "hyperparameters.lr"
    shot(page, "compare")

    # By wall time: the same two runs, the axis now in time since each began.
    page.select_option("select[aria-label='x axis']", "time")
    page.click("#compare-form button")
    page.wait_for_url("**x=time**")
    page.wait_for_selector("#chart-compare .scatterlayer .trace path.js-line")
    assert page.evaluate("document.getElementById('chart-compare').data.length") == 2
    title = page.evaluate("document.getElementById('chart-compare').layout.xaxis.title.text")
    assert "since the run's first point" in title
    page.check("#only-differences")
    assert page.locator("#compare-params tr.same").first.is_hidden()
    shot(page, "compare-by-time")
