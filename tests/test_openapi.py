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
