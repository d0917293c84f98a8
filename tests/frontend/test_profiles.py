"""The job page's Profiles section: asking for a profile from the page, and
a download link per rank that works for the team and no one else."""

import gzip
import json
import re

from jobs.models import JobEvent
from tests.profile_factories import TRACE, write_trace

from .factories import make_job, run


def trace_links(html: str) -> list[str]:
    return re.findall(r'<a href="([^"]+)" class="profile-trace"', html)


def test_the_job_page_links_each_ranks_trace_and_the_team_downloads_them(
        web, teammate, outsider, team, cluster, fleet_dirs):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    for rank in (0, 1):
        write_trace(attempt, rank, start_step=40, steps=5)
    client = web(teammate)

    html = client.get(f"/jobs/{job.pk}/").content.decode()

    assert '<section class="card" id="profiles"><h2>Profiles</h2>' in html
    assert "40–44" in html and ">rank 0</a>" in html and ">rank 1</a>" in html
    links = trace_links(html)
    assert len(links) == 2
    for link in links:
        resp = client.get(link)
        assert resp.status_code == 200
        assert json.loads(gzip.decompress(b"".join(resp.streaming_content))) == TRACE
        assert web(outsider).get(link).status_code == 404
    assert web(outsider).get(f"/jobs/{job.pk}/").status_code == 404


def test_the_page_asks_for_a_profile_of_the_running_job(web, owner, team, cluster, fleet_dirs):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    client = web(owner)
    assert 'id="profile-job"' in client.get(f"/jobs/{job.pk}/").content.decode()

    resp = client.post(f"/jobs/{job.pk}/profile/", {"steps": "7"}, follow=True)

    attempt.refresh_from_db()
    assert attempt.profile_request_id and attempt.profile_steps == 7
    assert "Profile of the next 7 steps requested" in resp.content.decode()
    assert JobEvent.objects.get(job=job, kind="ProfileRequested").actor == "user:olivia"
    # Pending: the button is off and a second post writes nothing.
    assert re.search(r'id="profile-job" disabled', resp.content.decode())
    client.post(f"/jobs/{job.pk}/profile/", {"steps": "7"})
    assert JobEvent.objects.filter(job=job, kind="ProfileRequested").count() == 1


def test_the_page_refuses_bad_steps_and_a_job_that_is_not_running(
        web, owner, team, cluster, fleet_dirs):
    job = make_job(team, cluster)
    client = web(owner)
    assert 'id="profile-job"' not in client.get(f"/jobs/{job.pk}/").content.decode()
    not_running = client.post(f"/jobs/{job.pk}/profile/", {"steps": "3"}, follow=True)
    assert "only a running job can be profiled" in not_running.content.decode()
    run(job, list(cluster.nodes.all()[:2]))
    bad = client.post(f"/jobs/{job.pk}/profile/", {"steps": "500"}, follow=True)
    assert "steps:" in bad.content.decode()
    assert not JobEvent.objects.filter(job=job, kind="ProfileRequested").exists()
