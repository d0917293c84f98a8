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
