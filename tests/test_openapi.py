"""The OpenAPI schema renders, validates without warnings, and describes
every API route; the interactive docs page is served."""

import re

import pytest
from django.core.management import call_command

from tests.test_authorization_matrix import ENDPOINTS


@pytest.mark.timeout(120)
def test_the_schema_generates_and_validates_without_warnings(tmp_path, db):
    out = tmp_path / "schema.yaml"
    # --fail-on-warn turns any generator warning or error into an exception.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert "/api/v1/jobs/" in out.read_text()


def test_the_schema_is_served_and_lists_every_endpoint(client, db):
    resp = client.get("/api/schema/?format=json")
    assert resp.status_code == 200
    schema = resp.json()
    assert schema["info"]["title"] == "Regatta API"
    paths = set(schema["paths"])
    for _, path, _, _ in ENDPOINTS:
        shape = re.sub(r"\{[^}]+\}", "{x}", path.split("?")[0]).replace("vision", "{x}")
        assert shape in {re.sub(r"\{[^}]+\}", "{x}", p) for p in paths}, shape
    schemes = schema["components"]["securitySchemes"]
    assert {"apiToken", "workerToken"} <= set(schemes)
    submit = schema["paths"]["/api/v1/jobs/"]["post"]
    body = submit["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    spec = schema["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert {"name", "cluster", "num_nodes", "gpus_per_node"} <= set(spec["required"])


def test_the_interactive_docs_are_served(client, db):
    resp = client.get("/api/docs/")
    assert resp.status_code == 200
    assert b"swagger" in resp.content.lower()


def test_the_interactive_docs_need_no_internet(client, db):
    """Swagger UI comes from our own static files, not a CDN, so the page is
    not blank on an offline machine."""
    page = client.get("/api/docs/").content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    scripts = [a for a in assets if a.endswith((".js", ".css"))]
    assert scripts, page
    for asset in scripts:
        assert asset.startswith("/static/"), asset
        # Served through whitenoise's finders: the test client sees the file itself.
        resp = client.get(asset)
        assert resp.status_code == 200, asset
    assert "cdn" not in page.lower() and "https://" not in page


@pytest.fixture
def schema(client, db):
    return client.get("/api/schema/?format=json").json()


def _operations(schema):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            yield path, method, op


def _body_schema(schema, op):
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_operation_documents_its_error_replies(schema):
    error = "#/components/schemas/Error"
    assert "detail" in schema["components"]["schemas"]["Error"]["properties"]
    for path, method, op in _operations(schema):
        codes = {"400", "401", "403"} | ({"404"} if "{" in path else set())
        assert codes <= set(op["responses"]), (method, path)
        for code in codes:  # the shared shape, unless the view documents its own
            assert op["responses"][code]["content"]["application/json"]["schema"], (
                method, path, code)
    assert schema["paths"]["/api/v1/jobs/{id}/"]["get"]["responses"]["404"]["content"][
        "application/json"]["schema"]["$ref"] == error


def test_request_bodies_allow_no_field_the_server_refuses(schema):
    for path in ("/api/v1/jobs/", "/api/v1/webhooks/", "/api/v1/tokens/"):
        assert _body_schema(schema, schema["paths"][path]["post"])[
            "additionalProperties"] is False, path


def test_the_schema_bounds_query_parameters_as_the_server_does(schema, api, owner, team,
                                                               cluster):
    from tests.api_factories import make_job

    params = {(path, p["name"]): p["schema"] for path, method, op in _operations(schema)
              for p in op.get("parameters", [])}
    points = params[("/api/v1/jobs/{id}/metrics/", "points")]
    assert points["maximum"] == 5000 and points["minimum"] == 2
    job = make_job(team, cluster, owner)
    url = f"/api/v1/jobs/{job.pk}/metrics/?name=loss&points="
    assert api(owner).get(url + "5000").status_code == 200
    assert api(owner).get(url + "5001").status_code == 400
    # A cursor the server writes matches the documented pattern.
    make_job(team, cluster, owner, name="second")
    nxt = api(owner).get("/api/v1/jobs/?limit=1").json()["next"]
    cursor = re.search(r"cursor=([^&]+)", nxt).group(1)
    assert re.fullmatch(params[("/api/v1/jobs/", "cursor")]["pattern"], cursor)


def _param(schema, path, name, method="get"):
    return next(p for p in schema["paths"][path][method].get("parameters", [])
                if p["name"] == name)


def _field(schema, path, method, name):
    return _body_schema(schema, schema["paths"][path][method])["properties"][name]


KEYSET_LISTS = ["/api/v1/artifacts/", "/api/v1/jobs/", "/api/v1/jobs/{id}/attempts/",
                "/api/v1/jobs/{id}/checkpoints/", "/api/v1/jobs/{id}/events/"]


@pytest.mark.parametrize("path", KEYSET_LISTS)
def test_a_cursor_is_stated_as_the_server_writes_it_and_a_stray_one_is_a_404(schema, path):
    pattern = _param(schema, path, "cursor")["schema"]["pattern"]
    assert not re.search(pattern, "0") and not re.search(pattern, "")
    assert re.search(pattern, "eyJrIjpbMV0sImIiOjB9")
    assert "404" in schema["paths"][path]["get"]["responses"]


def test_query_parameters_state_their_bounds(schema):
    jobs = _param(schema, "/api/v1/jobs/compare/", "jobs")
    assert jobs["required"] and jobs["schema"]["minLength"] == 1
    for good in ("12", "12,15", ",".join(["7"] * 10)):
        assert re.search(jobs["schema"]["pattern"], good), good
    for bad in ("", "0", "12,,15", " 12", ",".join(["7"] * 11), "1" * 19):
        assert not re.search(jobs["schema"]["pattern"], bad), bad
    name = _param(schema, "/api/v1/jobs/{id}/metrics/", "name")
    assert name["required"] and name["schema"]["maxLength"] == 64
    assert name["schema"]["minLength"] == 1
    parent = _param(schema, "/api/v1/jobs/", "parent")["schema"]
    assert parent["type"] == "integer" and parent["minimum"] == 1
    team = _param(schema, "/api/v1/jobs/", "team")["schema"]
    assert not re.search(team["pattern"], "vi\x00sion")


@pytest.mark.parametrize(("path", "method", "field"), [
    ("/api/v1/quotas/", "post", "team"), ("/api/v1/quotas/", "post", "cluster"),
    ("/api/v1/quotas/{id}/", "patch", "team"), ("/api/v1/quotas/{id}/", "patch", "cluster"),
    ("/api/v1/webhooks/", "post", "url"), ("/api/v1/webhooks/{id}/", "patch", "url"),
    ("/api/v1/jobs/", "post", "name"), ("/api/v1/jobs/", "post", "cluster"),
    ("/api/v1/tokens/", "post", "name"),
])
def test_a_text_field_that_may_not_be_blank_says_so(schema, path, method, field):
    stated = _field(schema, path, method, field)
    assert stated["minLength"] == 1
    for blank in ("", " ", "\t\n", "\x1f", "\u3000", "\x00"):
        assert not re.search(stated["pattern"], blank), repr(blank)
    assert re.search(stated["pattern"], " a ")


def test_the_job_spec_states_its_budgets_env_and_team(schema):
    budgets = _field(schema, "/api/v1/jobs/", "post", "restart_budgets")
    assert budgets["additionalProperties"] is False
    assert set(budgets["properties"]) == {"code", "transient", "hardware", "preempted", "hang",
                                          "process"}
    assert all(p == {"type": "integer", "minimum": 0, "maximum": 100}
               for p in budgets["properties"].values())
    env = _field(schema, "/api/v1/jobs/", "post", "env")
    assert env["additionalProperties"]["type"] == "string" and env["maxProperties"] == 256
    assert "exactly one" in _field(schema, "/api/v1/jobs/", "post", "team")["description"]


@pytest.mark.parametrize(("path", "method", "codes"), [
    ("/api/v1/jobs/", "post", {"413", "415"}),
    ("/api/v1/webhooks/{id}/", "patch", {"413", "415"}),
    ("/api/v1/jobs/{id}/restart/", "post", {"409", "413", "415"}),
    ("/api/v1/checkpoints/{id}/files/", "get", {"409", "503"}),
    ("/api/v1/checkpoints/{id}/files/{path}", "get", {"409", "503"}),
    ("/api/v1/webhooks/{id}/ping/", "post", {"409", "429", "413"}),
    ("/api/v1/deliveries/{id}/retry/", "post", {"409", "429"}),
    ("/api/v1/tokens/", "post", {"429"}),
    ("/api/v1/nodes/{id}/faults/", "post", {"409"}),
    ("/api/v1/worker/attempts/{attempt_id}/metrics", "post", {"413"}),
])
def test_the_statuses_the_server_answers_are_documented(schema, path, method, codes):
    assert codes <= set(schema["paths"][path][method]["responses"]), path


def test_the_worker_bodies_state_the_parsers_bounds(schema):
    beat = _body_schema(schema, schema["paths"][
        "/api/v1/worker/attempts/{attempt_id}/heartbeat"]["post"])
    assert beat["additionalProperties"] is False
    rank = beat["properties"]["rank"]
    assert {k: rank[k] for k in ("type", "minimum", "maximum")} == {
        "type": "integer", "minimum": 0, "maximum": 65535}
    assert rank["description"] == "the rank beating"  # the contract's words
    assert beat["properties"]["samples_per_s"]["minimum"] == 0
    event = _body_schema(schema, schema["paths"][
        "/api/v1/worker/attempts/{attempt_id}/events"]["post"])
    assert re.search(event["properties"]["kind"]["pattern"], "started")
    assert not re.search(event["properties"]["kind"]["pattern"], "Started!")
