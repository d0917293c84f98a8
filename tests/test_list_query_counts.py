"""Every list endpoint answers in a fixed number of queries, however many
rows it shows: each is read with a few rows, then with several times as
many, and the count must not move (an N+1 makes it grow with the rows) and
stays under a small bound."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from checkpoints.models import ModelArtifact
from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from jobs.models import AttemptNode, JobEvent, Quota, RankStatus, Team
from tests.api_factories import make_attempt, make_checkpoint, make_job
from tests.conftest import client_for

# Queries any request pays before the list: the token, its user, the
# token's last use; then the list, its prefetches and the job's scope.
MAX_QUERIES = 12


def warm(client):
    """The first request of a token also records its use: not the list's cost."""
    assert client.get("/api/v1/me/").status_code == 200
    return client


def queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(url)
    assert resp.status_code == 200, resp.content
    assert resp.data["results"], f"{url} showed nothing: the test would prove nothing"
    return len(ctx.captured_queries)


def job_rows(job, n, start):
    """n attempts (each with a placement and a rank), events, checkpoints
    and artifacts for `job`."""
    node = job.cluster.nodes.order_by("pk").first()
    for i in range(start, start + n):
        attempt, _ = make_attempt(job, number=i + 1)
        AttemptNode.objects.create(attempt=attempt, node=node, node_rank=0)
        RankStatus.objects.create(attempt=attempt, rank=0, node_name=node.name, step=i,
                                  last_heartbeat_at=timezone.now())
        JobEvent.objects.create(job=job, attempt=attempt, kind="Step", message=str(i))
        checkpoint = make_checkpoint(job, step=(i + 1) * 100, attempt=attempt)
        ModelArtifact.objects.create(job=job, checkpoint=checkpoint, name="m", version=i + 1,
                                     uri=f"/tmp/m/{i}")


def fleet_rows(cluster, team, n, start):
    """n more jobs of `team`, n teams with a quota and a member, n nodes
    with a health event, and a pool."""
    for i in range(start, start + n):
        make_job(team, cluster, name=f"j{i}", phase="running")
        other = Team.objects.create(name=f"t{i}")
        Quota.objects.create(team=other, cluster=cluster, gpus=2)
        other.members.add(*team.members.all())
        pool = NodePool.objects.create(cluster=cluster, name=f"p{i}", gpus_per_node=2)
        node = Node.objects.create(cluster=cluster, pool=pool, name=f"n{i}", gpus=2,
                                   state=Node.State.READY)
        NodeHealthEvent.objects.create(node=node, kind="xid", severity="critical",
                                       created_at=timezone.now())
        Cluster.objects.create(name=f"c{i}", provider=Cluster.Provider.LOCAL)


def job_urls(job):
    return [f"/api/v1/jobs/{job.pk}/events/", f"/api/v1/jobs/{job.pk}/attempts/",
            f"/api/v1/jobs/{job.pk}/checkpoints/", f"/api/v1/artifacts/?job={job.pk}"]


FLEET_URLS = ["/api/v1/jobs/", "/api/v1/jobs/?team=vision&phase=running",
              "/api/v1/teams/", "/api/v1/quotas/", "/api/v1/clusters/", "/api/v1/pools/",
              "/api/v1/nodes/", "/api/v1/health-events/", "/api/v1/tokens/"]


def test_a_job_s_lists_take_the_same_queries_for_two_rows_or_eight(owner, job):
    client = warm(client_for(owner))
    job_rows(job, 2, 0)
    few = {url: queries(client, url) for url in job_urls(job)}
    job_rows(job, 6, 2)
    many = {url: queries(client, url) for url in job_urls(job)}
    assert many == few
    assert max(many.values()) <= MAX_QUERIES, many


@pytest.mark.parametrize("who", ["owner", "operator"])
def test_the_fleet_s_lists_take_the_same_queries_for_two_rows_or_eight(
        request, who, team, cluster, owner):
    client = warm(client_for(request.getfixturevalue(who)))
    fleet_rows(cluster, team, 2, 0)
    few = {url: queries(client, url) for url in FLEET_URLS}
    fleet_rows(cluster, team, 6, 2)
    many = {url: queries(client, url) for url in FLEET_URLS}
    assert many == few
    assert max(many.values()) <= MAX_QUERIES, many
