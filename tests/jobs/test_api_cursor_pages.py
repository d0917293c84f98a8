"""Lists that grow with the data page by cursor (controlplane/lib/keyset.py):
following `next` walks every row once, in order, even where the sort key
ties; `previous` comes back; offset pages still work; a cursor not of the
server's shape is 400, one of its shape that names no page 404."""

import base64
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobEvent, TrainingJob
from tests.api_factories import make_attempt, make_checkpoint, make_job


def walk(client, url):
    """Every page's ids from `url` on, following `next`."""
    pages = []
    while url:
        resp = client.get(url)
        assert resp.status_code == 200, resp.data
        pages.append([row["id"] for row in resp.data["results"]])
        url = resp.data["next"]
    return pages


@pytest.fixture
def seven_jobs(team, cluster, owner):
    """Seven jobs, four of them created in the same microsecond (ties on
    the first sort key are where a keyset page can skip or repeat rows)."""
    jobs = [make_job(team, cluster, owner, name=f"j{i}") for i in range(7)]
    same = timezone.now() - timedelta(hours=1)
    TrainingJob.objects.filter(pk__in=[j.pk for j in jobs[1:5]]).update(created_at=same)
    return list(TrainingJob.objects.order_by("-created_at", "-id").values_list("pk", flat=True))


def test_following_next_walks_every_job_once_in_order(api, owner, seven_jobs):
    pages = walk(api(owner), "/api/v1/jobs/?limit=2")
    assert pages == [seven_jobs[0:2], seven_jobs[2:4], seven_jobs[4:6], seven_jobs[6:7]]


def test_a_page_carries_no_count_unless_asked(api, owner, seven_jobs):
    client = api(owner)
    assert "count" not in client.get("/api/v1/jobs/?limit=2").data
    assert client.get("/api/v1/jobs/?limit=2&count=true").data["count"] == 7
    resp = client.get("/api/v1/jobs/?count=maybe")
    assert resp.status_code == 400 and "count" in resp.data


def test_previous_comes_back_to_the_page_before(api, owner, seven_jobs):
    client = api(owner)
    first = client.get("/api/v1/jobs/?limit=3").data
    assert first["previous"] is None
    second = client.get(first["next"]).data
    third = client.get(second["next"]).data
    back = client.get(third["previous"]).data
    assert [r["id"] for r in back["results"]] == seven_jobs[3:6]
    assert [r["id"] for r in client.get(back["previous"]).data["results"]] == seven_jobs[0:3]
    assert client.get(back["previous"]).data["previous"] is None


def test_an_offset_page_still_works_and_its_next_link_is_a_cursor(api, owner, seven_jobs):
    client = api(owner)
    page = client.get("/api/v1/jobs/?limit=2&offset=3").data
    assert [r["id"] for r in page["results"]] == seven_jobs[3:5]
    assert "cursor=" in page["next"] and "offset=" not in page["next"]
    assert "offset=1" in page["previous"]
    assert walk(client, page["next"]) == [seven_jobs[5:7]]


def test_filters_stay_on_the_cursor_links(api, owner, team, cluster, seven_jobs):
    TrainingJob.objects.filter(pk__in=seven_jobs[:5]).update(phase="running")
    pages = walk(api(owner), "/api/v1/jobs/?limit=2&phase=running&team=vision&cluster=cpu-a")
    assert sum(pages, []) == seven_jobs[:5]


def _cursor(payload) -> str:
    """Encoded as the server encodes its own (compact JSON, unpadded)."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "not-a-cursor", "%%%", "0", "", _cursor([1, 2]), _cursor({"b": 0}),
    _cursor({"k": [1], "b": 0}) + "==",  # padded: never how the server writes one
    base64.urlsafe_b64encode(b'{"k": [1], "b": 0}').decode(),
])
def test_a_cursor_of_another_shape_is_a_400_naming_it(api, owner, seven_jobs, cursor):
    """The schema's pattern for `cursor` is the shape the server writes."""
    resp = api(owner).get("/api/v1/jobs/", {"cursor": cursor})
    assert resp.status_code == 400 and "cursor" in resp.data


@pytest.mark.parametrize("cursor", [
    _cursor({"k": [1], "b": 0}), _cursor({"k": ["yesterday", 3], "b": 0}),
    _cursor({"k": ["2026-01-01T00:00:00+00:00", 10**30], "b": 0}),
    _cursor({"k": ["2026-01-01T00:00:00+00:00", True], "b": 0}),
    _cursor({"k": [None, 1], "b": 0}), "eyJrIjpbmadeup", "eyJrIjpbX",
])
def test_a_cursor_of_the_right_shape_that_names_no_page_is_a_404(api, owner, seven_jobs,
                                                                 cursor):
    resp = api(owner).get("/api/v1/jobs/", {"cursor": cursor})
    assert resp.status_code == 404 and "cursor" in resp.data["detail"]


def test_events_checkpoints_and_attempts_page_by_cursor(api, owner, team, cluster):
    job = make_job(team, cluster, owner)
    at = timezone.now()
    for i in range(5):  # same timestamp: the id breaks the tie
        JobEvent.objects.create(job=job, kind=f"K{i}", created_at=at)
    events = list(job.events.order_by("created_at", "id").values_list("pk", flat=True))
    attempts = [make_attempt(job, number=n)[0].pk for n in range(1, 6)]
    steps = [make_checkpoint(job, step).pk for step in (500, 400, 300, 200, 100)]
    client = api(owner)
    for path, expected in (("events", events), ("attempts", attempts), ("checkpoints", steps)):
        pages = walk(client, f"/api/v1/jobs/{job.pk}/{path}/?limit=2")
        assert pages == [expected[0:2], expected[2:4], expected[4:5]], path
