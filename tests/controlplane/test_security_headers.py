"""What a deployment's responses tell browsers: a Content-Security-Policy on
every answer, Strict-Transport-Security once the web is reached over HTTPS,
and HTTPS seen behind a TLS-terminating proxy only when the operator names
the header that proxy sets (REGATTA_PROXY_SSL_HEADER)."""

import json
import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.controlplane.test_settings import ROOT, _settings_of

pytestmark = pytest.mark.django_db

SECURE = {"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
          "SECURE_HSTS_SECONDS": 31_536_000}


@pytest.mark.parametrize("path", ["/login/", "/api/v1/jobs/", "/api/schema/", "/nowhere"])
def test_every_answer_carries_the_content_security_policy(path, settings):
    resp = Client().get(path)
    policy = resp["Content-Security-Policy"]
    assert policy == settings.CONTENT_SECURITY_POLICY
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert directives["connect-src"] == "'self'" and directives["form-action"] == "'self'"
    assert directives["base-uri"] == "'self'"


def test_an_empty_policy_sends_none(settings):
    settings.CONTENT_SECURITY_POLICY = ""
    assert "Content-Security-Policy" not in Client().get("/login/")


def test_hsts_is_sent_over_https_behind_the_named_proxy_header(settings):
    for name, value in SECURE.items():
        setattr(settings, name, value)
    resp = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert resp["Strict-Transport-Security"] == "max-age=31536000"
    # Over plain HTTP a browser would ignore it, and it is not sent.
    assert "Strict-Transport-Security" not in Client().get("/login/")


def test_a_forwarded_proto_is_not_believed_unless_the_operator_names_it(settings):
    """Without REGATTA_PROXY_SSL_HEADER a client could claim HTTPS itself."""
    settings.SECURE_HSTS_SECONDS = 31_536_000
    assert settings.SECURE_PROXY_SSL_HEADER is None
    resp = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert "Strict-Transport-Security" not in resp


def _security_settings(tmp_path, **env) -> list:
    names = ["SECURE_PROXY_SSL_HEADER", "SECURE_HSTS_SECONDS", "CONTENT_SECURITY_POLICY"]
    code = ("import django, json; django.setup(); from django.conf import settings; "
            f"print(json.dumps([getattr(settings, n) for n in {names!r}]))")
    base = {k: v for k, v in os.environ.items() if not k.startswith("REGATTA_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={**base, **env, "REGATTA_STATE_DIR": str(tmp_path),
                              "DJANGO_SETTINGS_MODULE": "controlplane.settings"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(("env", "header", "hsts", "csp"), [
    ({}, None, 31_536_000, True),
    ({"REGATTA_PUBLIC_URL": "https://regatta.example.com",
      "REGATTA_PROXY_SSL_HEADER": "X-Forwarded-Proto"},
     ["HTTP_X_FORWARDED_PROTO", "https"], 31_536_000, True),
    ({"REGATTA_PROXY_SSL_HEADER": "X-Forwarded-Scheme=HTTPS", "REGATTA_HSTS_SECONDS": "600",
      "REGATTA_CSP": "off"}, ["HTTP_X_FORWARDED_SCHEME", "HTTPS"], 600, False),
])
def test_the_settings_come_from_the_environment_with_safe_defaults(tmp_path, env, header,
                                                                   hsts, csp):
    found_header, found_hsts, policy = _security_settings(tmp_path, **env)
    assert (found_header, found_hsts, "default-src 'self'" in policy) == (header, hsts, csp)


@pytest.mark.slow
def test_a_malformed_proxy_header_stops_the_process_at_start_naming_it(tmp_path):
    out = _settings_of(tmp_path, ["SECRET_KEY"], REGATTA_PROXY_SSL_HEADER="X Forwarded: yes")
    assert out.returncode != 0
    assert "REGATTA_PROXY_SSL_HEADER must be a header name" in out.stderr
