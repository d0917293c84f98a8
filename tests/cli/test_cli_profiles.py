"""`regatta profile` and `regatta profiles` against a live server over real
HTTP: asking for a profile, listing the traces, downloading them."""

import gzip
import json

import pytest

from jobs.models import JobEvent
from tests.frontend.factories import make_job, run
from tests.profile_factories import TRACE, write_trace

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(120)]


def test_profile_asks_once_and_says_so_when_one_is_under_way(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    run(job, list(cluster.nodes.all()[:2]))
    regatta = logged_in(owner)

    first = regatta("profile", job.pk, "--steps", 4)
    again = json.loads(regatta("profile", job.pk, "--steps", 4, "--json").output)

    assert first.exit_code == 0, first.stderr
    assert "Profile of the next 4 steps requested on attempt" in first.output
    assert again["created"] is False and again["steps"] == 4
    assert JobEvent.objects.filter(job=job, kind="ProfileRequested").count() == 1
    too_many = regatta("profile", job.pk, "--steps", 51)
    assert too_many.exit_code == 2  # refused before it reaches the API


def test_profile_of_a_job_that_is_not_running_shows_the_api_s_409(
        logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    result = logged_in(owner)("profile", job.pk, "--steps", 3)
    assert result.exit_code == 1
    assert "HTTP 409" in result.stderr and "only a running job can be profiled" in result.stderr


def test_profiles_lists_and_downloads_the_newest_profile_for_the_team_only(
        logged_in, owner, outsider, team, cluster, fleet_dirs, tmp_path):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    write_trace(attempt, 0, request_id="old0", start_step=3)
    for rank in (0, 1):
        write_trace(attempt, rank, request_id="new1", start_step=20)
    regatta = logged_in(owner)

    listed = regatta("profiles", job.pk).output.splitlines()
    got = regatta("profiles", job.pk, "--out", tmp_path / "traces")

    assert listed[0].split() == ["ID", "STEPS", "RANK", "SIZE", "AGE", "REQUEST"]
    assert sorted(line.split()[1] for line in listed[1:]) == ["20..22", "20..22", "3..5"]
    assert got.exit_code == 0, got.stderr
    files = sorted((tmp_path / "traces").rglob("*.json.gz"))
    assert [f.relative_to(tmp_path / "traces").as_posix() for f in files] == [
        "step-20-new1/rank-0.json.gz", "step-20-new1/rank-1.json.gz"]
    for f in files:
        with gzip.open(f, "rt") as fh:
            assert json.load(fh) == TRACE
    theirs = logged_in(outsider)("profiles", job.pk)
    assert theirs.exit_code == 1 and "HTTP 404" in theirs.stderr
