"""What every request gets before a view: a query parameter PostgreSQL
cannot store is a 400 naming it, a URL missing its slash is a 308 that keeps
the method, and an unknown /api/ path is a JSON 404."""

import pytest

from jobs.models import TrainingJob
from notifications.models import Webhook
from tests.api_factories import make_job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", [
    "/api/v1/webhooks/?team=%00",
    "/api/v1/jobs/{job}/profiles/?request_id=%00",
    "/api/v1/jobs/?team=a%00b&limit=5",
])
def test_a_nul_in_a_query_parameter_is_a_400_naming_it(api, owner, team, cluster, path):
    job = make_job(team, cluster, owner)
    resp = api(owner).get(path.format(job=job.pk))
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert list(body) == [path.split("?")[1].split("=")[0]] and "NUL" in body[
        next(iter(body))][0]


def test_a_nul_in_a_query_parameter_s_name_is_named_too(api, owner):
    resp = api(owner).get("/api/v1/jobs/?a%00=1")
    assert resp.status_code == 400 and list(resp.json()) == ["'a\\x00'"]


def test_a_page_answers_a_nul_in_its_query_with_a_400_too(client, owner):
    client.force_login(owner)
    resp = client.get("/jobs/?team=%00")
    assert resp.status_code == 400 and b"NUL" in resp.content


def test_a_post_without_the_trailing_slash_is_redirected_keeping_its_method(api, owner):
    resp = api(owner).post("/api/v1/webhooks", {"team": "vision"}, format="json")
    assert resp.status_code == 308 and resp["Location"] == "/api/v1/webhooks/"
    assert not Webhook.objects.exists()


def test_a_client_that_follows_the_308_creates_what_it_posted(api, owner, cluster):
    body = {"name": "slashless", "cluster": "cpu-a", "num_nodes": 1, "gpus_per_node": 1,
            "hyperparameters": {"model": "nano", "max_steps": 50}}
    resp = api(owner).post("/api/v1/jobs?x=1", body, format="json", follow=True)
    assert resp.redirect_chain == [("/api/v1/jobs/?x=1", 308)]
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.filter(name="slashless").exists()


@pytest.mark.parametrize("path", ["/api/v1/nothing-here/", "/api/v1/nothing-here",
                                  "/api/v2/jobs/", "/api/"])
def test_an_unknown_api_path_is_a_json_404(api, owner, path):
    resp = api(owner).get(path)
    assert resp.status_code == 404
    assert resp["Content-Type"] == "application/json" and resp.json() == {"detail": "Not found."}


def test_an_unknown_page_is_still_an_html_404(client):
    resp = client.get("/nothing-here/")
    assert resp.status_code == 404 and resp["Content-Type"].startswith("text/html")
