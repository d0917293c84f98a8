"""The API's limits: JSON nested past MAX_JSON_DEPTH, strings PostgreSQL
cannot store and nonsense pagination are clear 400s naming the limit or the
field, never a 500; a huge `limit` is capped; every bad field of a spec is
named in one reply; responses keep the schema's promises."""

import json

import pytest

from controlplane.lib.pagination import MAX_LIMIT, MAX_OFFSET
from controlplane.lib.parsers import MAX_JSON_DEPTH
from jobs.models import TrainingJob
from tests.api_factories import make_attempt, make_job, worker_client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deeply_nested_json_is_a_400_naming_the_limit(api, owner, depth):
    resp = api(owner).post("/api/v1/jobs/", nested(depth), content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert str(MAX_JSON_DEPTH) in resp.json()["detail"]


def test_deeply_nested_json_to_a_worker_endpoint_is_a_400_too(team, cluster, owner):
    attempt, token = make_attempt(make_job(team, cluster, owner, phase="running"))
    body = '{"kind": "started", "rank": 0, "data": {"x": ' + nested(100_000) + "}}"
    resp = worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/events", body,
                                     content_type="application/json")
    assert resp.status_code == 400
    assert str(MAX_JSON_DEPTH) in resp.json()["detail"]


def test_nesting_up_to_the_limit_is_parsed(api, owner, cluster):
    # 1 (the spec) + 1 (hyperparameters) + the rest: exactly at the limit.
    deep = {"x": 1}
    for _ in range(MAX_JSON_DEPTH - 3):
        deep = {"x": deep}
    body = {"name": "a", "cluster": "cpu-a", "num_nodes": 1, "gpus_per_node": 1,
            "hyperparameters": {"model": "nano", "max_steps": 5, "extra": deep}}
    resp = api(owner).post("/api/v1/jobs/", json.dumps(body), content_type="application/json")
    assert "JSON nested" not in str(resp.content)


@pytest.mark.parametrize("bad", ["a\u0000b", "\ud800"])
def test_a_nul_or_lone_surrogate_nested_in_a_spec_is_named(api, owner, cluster, bad):
    body = {"name": "ok", "cluster": "cpu-a", "num_nodes": 1, "gpus_per_node": 1,
            "hyperparameters": {"model": "nano", "tags": ["fine", bad]}}
    resp = api(owner).post("/api/v1/jobs/", json.dumps(body), content_type="application/json")
    assert resp.status_code == 400
    assert "hyperparameters.tags[1]" in resp.json()
    assert not TrainingJob.objects.exists()


def test_a_bad_key_is_named_escaped(api, owner, cluster):
    body = '{"name": "ok", "hyperparameters": {"a\\u0000": 1}}'
    resp = api(owner).post("/api/v1/jobs/", body, content_type="application/json")
    assert resp.status_code == 400
    assert "hyperparameters.'a\\x00'" in resp.json()


def test_every_bad_field_of_a_spec_is_named_at_once(api, owner, cluster):
    body = {"name": "", "cluster": "cpu-a", "num_nodes": 9, "gpus_per_node": 2,
            "colour": "blue", "storage_uri": "/etc/passwd"}
    resp = api(owner).post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 400
    # A field's own error, an unknown field and the checks across fields
    # (the pool's size, the team's storage) all in one reply.
    assert {"name", "colour", "num_nodes", "storage_uri"} <= set(resp.data), resp.data


def test_a_huge_limit_is_capped(api, owner, team, cluster):
    for i in range(3):
        make_job(team, cluster, owner, name=f"j{i}")
    resp = api(owner).get("/api/v1/jobs/?limit=9223372036854775808")
    assert resp.status_code == 200
    assert len(resp.data["results"]) == 3
    longer = "9" * 400
    assert api(owner).get(f"/api/v1/jobs/?limit={longer}").status_code == 200
    # The links of a capped page carry the cap.
    resp = api(owner).get("/api/v1/jobs/?limit=99999&offset=1")
    assert f"limit={MAX_LIMIT}" in resp.data["previous"]


@pytest.mark.parametrize("query", [
    "limit=abc", "limit=0", "limit=-1", "limit=1.5", "offset=-1", "offset=x",
    f"offset={MAX_OFFSET + 1}", "offset=9223372036854775808", "offset=" + "9" * 400,
])
def test_nonsense_pagination_is_a_400_naming_the_parameter(api, owner, team, query):
    resp = api(owner).get(f"/api/v1/jobs/?{query}")
    assert resp.status_code == 400, resp.content
    assert query.split("=")[0] in resp.data


@pytest.mark.parametrize("path", ["/api/v1/nodes/", "/api/v1/teams/", "/api/v1/quotas/",
                                  "/api/v1/clusters/", "/api/v1/artifacts/"])
def test_every_list_is_bounded(api, operator, path):
    assert api(operator).get(f"{path}?offset=9223372036854775808").status_code == 400
    assert api(operator).get(f"{path}?limit=9223372036854775808").status_code == 200


def test_a_running_attempts_failure_class_is_null(api, owner, team, cluster):
    job = make_job(team, cluster, owner, phase="running")
    make_attempt(job)
    resp = api(owner).get(f"/api/v1/jobs/{job.pk}/attempts/")
    assert resp.status_code == 200
    assert resp.data["results"][0]["failure_class"] is None


def test_every_403_of_the_heartbeat_carries_stop(api, owner, team, cluster):
    job = make_job(team, cluster, owner, phase="running")
    attempt, _ = make_attempt(job)
    other, other_token = make_attempt(job)
    url = f"/api/v1/worker/attempts/{attempt.pk}/heartbeat"
    body = {"rank": 0, "node": "n", "step": 1}
    by_person = api(owner).post(url, body, format="json")
    by_other_attempt = worker_client(other_token).post(url, body, format="json")
    for resp in (by_person, by_other_attempt):
        assert resp.status_code == 403
        assert resp.data["stop"] is False and resp.data["detail"]


@pytest.mark.parametrize("bad", ["%00", "a%00b", "%ED%A0%80", "%FF"])
@pytest.mark.parametrize("query", [
    "/api/v1/jobs/?team={}", "/api/v1/jobs/?cluster={}", "/api/v1/jobs/?phase={}",
    "/api/v1/nodes/?cluster={}", "/api/v1/nodes/?state={}", "/api/v1/pools/?cluster={}",
    "/api/v1/health-events/?node={}", "/api/v1/artifacts/?name={}", "/api/v1/artifacts/?job={}",
    "/api/v1/jobs/{job}/metrics/?name={}", "/api/v1/teams/{}/goodput/",
])
def test_unstorable_strings_in_a_query_are_never_a_server_error(api, operator, owner, team,
                                                                 cluster, query, bad):
    job = make_job(team, cluster, owner)
    resp = api(operator).get(query.replace("{job}", str(job.pk)).format(bad))
    assert resp.status_code < 500, resp.content


def test_an_escaped_surrogate_pair_is_an_ordinary_character(api, owner, cluster):
    body = ('{"name": "emoji \\ud83d\\ude00", "cluster": "cpu-a", "num_nodes": 1, '
            '"gpus_per_node": 1, "hyperparameters": {"model": "nano", "max_steps": 20}}')
    resp = api(owner).post("/api/v1/jobs/", body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.get().name == "emoji \U0001f600"


@pytest.mark.parametrize("number", ["1e999", "-1E+400", "1" * 400 + ".5"])
def test_a_number_that_overflows_to_infinity_is_named_not_stored(team, cluster, owner, number):
    attempt, token = make_attempt(make_job(team, cluster, owner, phase="running"))
    body = '{"kind": "started", "rank": 0, "data": {"x": [1.5, NUMBER]}}'.replace("NUMBER", number)
    resp = worker_client(token).post(f"/api/v1/worker/attempts/{attempt.pk}/events", body,
                                     content_type="application/json")
    assert resp.status_code == 400, resp.content
    assert "data.x[1]" in resp.json()
    assert not attempt.job.events.exists()
