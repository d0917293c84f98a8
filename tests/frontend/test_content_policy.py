"""The pages work under the Content-Security-Policy every response carries
(REGATTA_CSP's default): a real Chromium visits each kind of page, with its
charts, live updates and inline handlers, and the policy refuses nothing."""

import pytest

from .factories import rich_job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(180)]


def test_no_page_runs_into_the_content_security_policy(open_page, live_server, settings,
                                                        admin_user_, team, cluster):
    assert "default-src 'self'" in settings.CONTENT_SECURITY_POLICY
    job = rich_job(team, cluster)
    page = open_page(admin_user_)
    refused, errors = [], []
    page.on("console", lambda msg: refused.append(msg.text)
            if "Content Security Policy" in msg.text else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    visits = [("/fleet/", ".tile"), ("/jobs/", "#job-filters"),
              (f"/jobs/{job.pk}/", "#chart-loss .scatterlayer .trace"),
              ("/teams/vision/", "#chart-goodput .barlayer .trace"),
              (f"/compare/?jobs={job.pk}", "body"), ("/admin/", "#content"),
              ("/api/docs/", ".swagger-ui .info")]
    for path, ready in visits:
        response = page.goto(live_server.url + path)
        assert response.headers["content-security-policy"] == settings.CONTENT_SECURITY_POLICY
        page.wait_for_selector(ready)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#chart-loss .scatterlayer .trace")
    page.wait_for_timeout(500)
    assert refused == [] and errors == []
