"""Every page of jobs that really restarted, succeeded, failed and were
cancelled on a local fleet of real torchrun ranks says what happened: no
Python `None`, no JavaScript `null`, `undefined` or `NaN` in the text a
person reads, whether the server rendered it or the page's scripts filled
it in (read in a real headless Chromium)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.test import Client

from clusters.models import Node
from clusters.providers import pool_info
from jobs.models import Phase
from tests.frontend.browser import shot
from tests.frontend.conftest import chromium, open_page  # noqa: F401 - fixtures

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NONSENSE = re.compile(r"\b(None|null|undefined|NaN)\b")


class _Text(HTMLParser):
    """The text of a page as a person reads it: no scripts, no styles."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "template"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "template") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return " ".join(parser.parts)


def nonsense(text: str) -> list[str]:
    return [text[max(0, m.start() - 60):m.end() + 60].replace("\n", " ")
            for m in NONSENSE.finditer(text)]


def refreshed(obj):
    obj.refresh_from_db()
    return obj


def running(job, number=1, min_step=1):
    def check():
        attempt = job.attempts.filter(number=number, state="running").first()
        return attempt if attempt and attempt.last_step >= min_step else None
    return check


def ended(fleet, job, phase):
    fleet.wait(f"job {job.name} {phase}", lambda: refreshed(job).phase == phase, job=job,
               timeout=240)


@pytest.mark.timeout(900)
def test_no_page_of_a_restarted_succeeded_failed_or_cancelled_job_says_none_or_null(
        fleet, operator, open_page, live_server):  # noqa: F811 - fixtures
    cluster = fleet.cluster(size=4, spares=1)
    restarted = fleet.submit(cluster, name="restarted", nodes=1, max_steps=40,
                             step_sleep_s=0.1)
    succeeded = fleet.submit(cluster, name="succeeded", nodes=1, max_steps=10)
    failed = fleet.submit(cluster, name="failed", nodes=1, max_steps=50, fail_at_step=3)
    cancelled = fleet.submit(cluster, name="cancelled", nodes=1, max_steps=400,
                             step_sleep_s=0.1)

    first = fleet.wait("the restarted job past its first checkpoint", running(restarted, 1, 7),
                       job=restarted, timeout=240)
    node = first.placements.get().node
    fleet.provider(cluster).inject_fault(pool_info(node.pool), node.name, "kill")
    fleet.wait("the cancelled job running", running(cancelled, 1, 1), job=cancelled,
               timeout=240)
    cancelled.request_cancel("test")
    from jobs import tasks

    tasks.reconcile_job.delay(cancelled.id)
    ended(fleet, cancelled, Phase.CANCELLED)
    ended(fleet, succeeded, Phase.SUCCEEDED)
    ended(fleet, failed, Phase.FAILED)
    ended(fleet, restarted, Phase.SUCCEEDED)
    assert restarted.attempts.count() == 2, fleet.story(restarted)

    jobs = (restarted, succeeded, failed, cancelled)
    pages = ["/fleet/", "/jobs/", f"/teams/{restarted.team.name}/"]
    for job in jobs:
        pages += [f"/jobs/{job.pk}/", f"/jobs/{job.pk}/attempts/", f"/jobs/{job.pk}/checkpoints/"]
    pages += [f"/nodes/{n.pk}/" for n in Node.objects.filter(cluster=cluster)]

    client = Client()
    client.force_login(operator)
    found = {}
    for path in pages:
        resp = client.get(path)
        assert resp.status_code == 200, path
        bad = nonsense(page_text(resp.content.decode()))
        if bad:
            found[path] = bad
    assert not found, found

    # The pages whose scripts fill in content (charts, goodput, live tables),
    # once they have drawn and polled.
    page = open_page(operator)
    for path in ["/fleet/", "/jobs/"] + [f"/jobs/{job.pk}/" for job in jobs]:
        page.goto(live_server.url + path)
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(2500)  # a live poll has replaced the server's fragments
        text = page.inner_text("body")
        bad = nonsense(text)
        if bad:
            found[path] = bad
        shot(page, "pages-" + path.strip("/").replace("/", "-"))
    assert not found, found
