"""Teams and quotas: members read usage against limits; admins write."""

import pytest

from clusters.models import Cluster
from jobs.admission import quota_usage
from jobs.models import Quota, Team, TrainingJob
from tests.api_factories import make_job


def test_members_see_their_quota_usage(api, owner, team, other_team, cluster):
    make_job(team, cluster, owner, phase="running", num_nodes=1, gpus_per_node=2)
    make_job(team, cluster, owner, phase="admitted", num_nodes=1, gpus_per_node=1)
    make_job(team, cluster, owner, phase="pending", num_nodes=2, gpus_per_node=2)
    make_job(team, cluster, owner, phase="succeeded", num_nodes=2, gpus_per_node=2)
    [quota] = api(owner).get("/api/v1/quotas/").data["results"]
    assert (quota["team"], quota["cluster"], quota["gpus"]) == ("vision", "cpu-a", 4)
    assert quota["usage"] == {"gpus_used": 3, "gpus_limit": 4, "gpus_free": 1,
                              "gpus_borrowed": 0, "gpus_lent": 0,
                              "running_jobs": 2, "running_jobs_limit": 3}


def test_quota_usage_shows_gpus_borrowed_and_lent(api, owner, team, other_team, cluster):
    make_job(team, cluster, owner, phase="running", num_nodes=2, gpus_per_node=2)
    extra = make_job(team, cluster, owner, phase="running", num_nodes=1, gpus_per_node=2)
    TrainingJob.objects.filter(pk=extra.pk).update(borrowed_gpus=2,
                                                   borrowed_from={str(other_team.id): 2})
    [quota] = api(owner).get("/api/v1/quotas/").data["results"]
    assert quota["usage"]["gpus_used"] == 6 and quota["usage"]["gpus_borrowed"] == 2
    assert quota["usage"]["gpus_free"] == 0
    job = api(owner).get(f"/api/v1/jobs/{extra.id}/").data
    assert (job["borrowed_gpus"], job["borrowed_from"]) == (2, {str(other_team.id): 2})
    lender = Quota.objects.get(team=other_team)
    assert quota_usage([lender])[lender.pk]["gpus_lent"] == 2


def test_teams_list_the_callers_teams_with_usage(api, owner, operator, team, other_team):
    data = api(owner).get("/api/v1/teams/").data["results"]
    assert [t["name"] for t in data] == ["vision"]
    assert data[0]["members"] == ["olivia"]
    assert data[0]["quotas"][0]["usage"]["gpus_free"] == 4
    assert [t["name"] for t in api(operator).get("/api/v1/teams/").data["results"]] == [
        "speech", "vision"]


def test_an_outsider_does_not_see_another_teams_quota(api, outsider, team):
    quota = Quota.objects.get(team=team)
    assert api(outsider).get(f"/api/v1/quotas/{quota.pk}/").status_code == 404
    assert [q["team"] for q in api(outsider).get("/api/v1/quotas/").data["results"]] == [
        "speech"]


def test_an_admin_creates_changes_and_deletes_a_quota(api, admin_user_, team, cluster):
    other = Cluster.objects.create(name="cpu-b")
    client = api(admin_user_)
    resp = client.post("/api/v1/quotas/", {"team": "vision", "cluster": "cpu-b", "gpus": 8},
                       format="json")
    assert resp.status_code == 201, resp.content
    quota = Quota.objects.get(team=team, cluster=other)
    assert (quota.gpus, quota.max_running_jobs) == (8, 10)
    resp = client.patch(f"/api/v1/quotas/{quota.pk}/", {"gpus": 16, "can_borrow": True},
                        format="json")
    assert resp.status_code == 200 and resp.data["gpus"] == 16
    quota.refresh_from_db()
    assert (quota.gpus, quota.can_borrow) == (16, True)
    assert client.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 204
    assert not Quota.objects.filter(pk=quota.pk).exists()


@pytest.mark.parametrize("body", [
    {"team": "vision", "cluster": "cpu-a", "gpus": 8},  # already has one there
    {"team": "ghosts", "cluster": "cpu-a", "gpus": 8},
    {"team": "vision", "cluster": "cpu-z", "gpus": 8},
    {"team": "vision", "cluster": "cpu-a", "gpus": -1},
    {"team": "vision", "cluster": "cpu-a", "gpus": "8"},
    {"team": "vision", "cluster": "cpu-a", "gpus": 8, "colour": "red"},
])
def test_a_bad_quota_is_400_and_writes_nothing(api, admin_user_, team, body):
    Team.objects.create(name="spare")
    before = list(Quota.objects.values_list("id", "gpus"))
    resp = api(admin_user_).post("/api/v1/quotas/", body, format="json")
    assert resp.status_code == 400
    assert list(Quota.objects.values_list("id", "gpus")) == before


@pytest.mark.parametrize("persona", ["owner", "operator"])
def test_only_admins_write_quotas(api, request, team, cluster, persona):
    user = request.getfixturevalue(persona)
    quota = Quota.objects.get(team=team)
    client = api(user)
    assert client.post("/api/v1/quotas/", {"team": "vision", "cluster": "cpu-a", "gpus": 1},
                       format="json").status_code == 403
    assert client.patch(f"/api/v1/quotas/{quota.pk}/", {"gpus": 99},
                        format="json").status_code == 403
    assert client.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 403
    quota.refresh_from_db()
    assert quota.gpus == 4
