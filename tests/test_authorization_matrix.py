"""Every endpoint × every persona: the job's owner, a teammate, a member of
another team, an operator, an admin, an anonymous caller, this attempt's
worker token and another attempt's worker token. Each cell is one request
against a fresh database, asserting the status code."""

import re
from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiToken
from clusters.models import Node
from jobs.models import JobAttempt, Quota
from jobs.profiling.models import ProfileTrace
from notifications.models import Webhook
from tests.api_factories import make_attempt, make_checkpoint, make_job, worker_client
from tests.conftest import client_for
from tests.profile_factories import write_trace

PERSONAS = ["owner", "teammate", "outsider", "operator", "admin", "anonymous", "worker",
            "other_worker"]


def codes(ok, *, owner=None, outsider=None, operator=None, admin=None, people=None):
    """The usual row: people get `ok`, anonymous callers and worker tokens 401."""
    people = ok if people is None else people
    row = {"owner": ok if owner is None else owner, "teammate": people,
           "outsider": people if outsider is None else outsider,
           "operator": ok if operator is None else operator,
           "admin": ok if admin is None else admin}
    return {**row, "anonymous": 401, "worker": 401, "other_worker": 401}


def member_only(ok):
    return codes(ok, outsider=404)


def operator_only(ok):
    return codes(ok, owner=403, people=403, outsider=403)


def admin_only(ok):
    return codes(ok, owner=403, people=403, outsider=403, operator=403)


def worker_only(ok):
    return {"owner": 403, "teammate": 403, "outsider": 403, "operator": 403, "admin": 403,
            "anonymous": 401, "worker": ok, "other_worker": 403}


@dataclass
class World:
    job: object
    attempt: object
    worker_token: str
    other_worker_token: str
    quota: object
    node: object
    checkpoint: object
    artifact: object
    owner_token: object
    stored_checkpoint: object
    webhook: object = None
    delivery: object = None
    trace: object = None  # a rank's profiler trace, with its file, of the finished job
    artifact_file: str = "model.pt"
    checkpoint_file: str = "export/model.pt"


BEAT = {"rank": 0, "node": "cpu-a-0", "step": 5}
SPEC = {"name": "m", "team": "vision", "cluster": "cpu-a", "num_nodes": 1, "gpus_per_node": 1}
POINTS = {"points": [{"rank": 0, "name": "loss", "step": 1, "value": 1.0}]}
HOOK = {"team": "vision", "url": "https://hooks.example.com/x", "events": ["job.failed"]}
CKPT = {"step": 300, "uri": "/tmp/ckpt/step-300", "bytes": 1}
# A repeated report of the trace the world's attempt already sent (200).
TRACE = {"request_id": "feedc0de", "rank": 0, "start_step": 5, "steps": 3,
         "uri": "/tmp/ckpt/profiles/step-5-feedc0de/rank-0.json.gz"}

ENDPOINTS = [
    ("get", "/api/v1/me/", None, codes(200)),
    ("get", "/api/v1/tokens/", None, codes(200)),
    ("post", "/api/v1/tokens/", {"name": "n"}, codes(201)),
    ("get", "/api/v1/tokens/{w.owner_token.pk}/", None,
     codes(200, people=404, operator=404, admin=404)),
    ("delete", "/api/v1/tokens/{w.owner_token.pk}/", None,
     codes(204, people=404, operator=404, admin=404)),
    ("get", "/api/v1/jobs/", None, codes(200)),
    ("post", "/api/v1/jobs/", SPEC, codes(201, outsider=400)),
    ("get", "/api/v1/jobs/{w.job.pk}/", None, member_only(200)),
    ("post", "/api/v1/jobs/{w.job.pk}/cancel/", None, member_only(200)),
    ("post", "/api/v1/jobs/{w.job.pk}/checkpoint/", None, member_only(202)),
    ("post", "/api/v1/jobs/{w.job.pk}/restart/", {"from_step": 100}, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/events/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/attempts/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/checkpoints/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/metrics/?name=loss", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/metrics/names/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/metrics/tensorboard/", None, member_only(200)),
    ("get", "/api/v1/jobs/compare/?jobs={w.job.pk}", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/goodput/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.job.pk}/evals/", None, member_only(200)),
    ("post", "/api/v1/jobs/{w.job.pk}/profile/", {"steps": 3}, member_only(202)),
    ("get", "/api/v1/jobs/{w.job.pk}/profiles/", None, member_only(200)),
    ("get", "/api/v1/jobs/{w.trace.job_id}/profiles/{w.trace.pk}/file", None, member_only(200)),
    ("get", "/api/v1/teams/", None, codes(200)),
    ("get", "/api/v1/teams/vision/goodput/", None, member_only(200)),
    ("get", "/api/v1/quotas/", None, codes(200)),
    ("post", "/api/v1/quotas/", {"team": "speech", "cluster": "cpu-b", "gpus": 2},
     admin_only(201)),
    ("get", "/api/v1/quotas/{w.quota.pk}/", None, member_only(200)),
    ("patch", "/api/v1/quotas/{w.quota.pk}/", {"gpus": 6}, admin_only(200)),
    ("delete", "/api/v1/quotas/{w.quota.pk}/", None, admin_only(204)),
    ("get", "/api/v1/clusters/", None, codes(200)),
    ("get", "/api/v1/clusters/{w.node.cluster_id}/", None, codes(200)),
    ("get", "/api/v1/pools/", None, codes(200)),
    ("get", "/api/v1/pools/{w.node.pool_id}/", None, codes(200)),
    ("get", "/api/v1/nodes/", None, codes(200)),
    ("get", "/api/v1/nodes/{w.node.pk}/", None, codes(200)),
    ("get", "/api/v1/health-events/", None, codes(200)),
    ("post", "/api/v1/nodes/{w.node.pk}/cordon/", {"reason": "r"}, operator_only(200)),
    ("post", "/api/v1/nodes/{w.node.pk}/uncordon/", None, operator_only(200)),
    ("post", "/api/v1/nodes/{w.node.pk}/drain/", None, operator_only(200)),
    ("post", "/api/v1/nodes/{w.node.pk}/replace/", None, operator_only(200)),
    # A ready node has nothing to return from: operators get the 409.
    ("post", "/api/v1/nodes/{w.node.pk}/return/", None, operator_only(409)),
    # An unknown kind: operators pass the permission check and reach validation.
    ("post", "/api/v1/nodes/{w.node.pk}/faults/", {"kind": "meteor"}, operator_only(400)),
    ("get", "/api/v1/checkpoints/{w.checkpoint.pk}/", None, member_only(200)),
    ("get", "/api/v1/artifacts/", None, codes(200)),
    ("get", "/api/v1/artifacts/{w.artifact.pk}/", None, member_only(200)),
    ("get", "/api/v1/artifacts/{w.artifact.pk}/files/", None, member_only(200)),
    ("get", "/api/v1/artifacts/{w.artifact.pk}/files/{w.artifact_file}", None,
     member_only(200)),
    ("get", "/api/v1/checkpoints/{w.stored_checkpoint.pk}/files/", None, member_only(200)),
    ("get", "/api/v1/checkpoints/{w.stored_checkpoint.pk}/files/{w.checkpoint_file}", None,
     member_only(200)),
    ("get", "/api/v1/webhooks/", None, codes(200)),
    ("post", "/api/v1/webhooks/", HOOK, codes(201, outsider=400)),
    ("get", "/api/v1/webhooks/{w.webhook.pk}/", None, member_only(200)),
    ("patch", "/api/v1/webhooks/{w.webhook.pk}/", {"description": "d"}, member_only(200)),
    ("delete", "/api/v1/webhooks/{w.webhook.pk}/", None, member_only(204)),
    ("get", "/api/v1/webhooks/{w.webhook.pk}/deliveries/", None, member_only(200)),
    ("post", "/api/v1/webhooks/{w.webhook.pk}/ping/", None, member_only(202)),
    ("post", "/api/v1/webhooks/{w.webhook.pk}/rotate-secret/", None, member_only(200)),
    ("post", "/api/v1/deliveries/{w.delivery.pk}/retry/", None, member_only(202)),
    ("post", "/api/v1/worker/attempts/{w.attempt.pk}/heartbeat", BEAT, worker_only(200)),
    ("post", "/api/v1/worker/attempts/{w.attempt.pk}/metrics", POINTS, worker_only(200)),
    ("post", "/api/v1/worker/attempts/{w.attempt.pk}/checkpoints", CKPT, worker_only(201)),
    ("post", "/api/v1/worker/attempts/{w.attempt.pk}/events", {"kind": "started"},
     worker_only(201)),
    ("post", "/api/v1/worker/attempts/{w.attempt.pk}/profiles", TRACE, worker_only(200)),
]


@pytest.fixture
def world(team, other_team, cluster, owner, teammate, outsider, operator, fleet_dirs):
    from django.utils import timezone

    from checkpoints.export import export_final
    from clusters.models import Cluster
    from jobs.checkpointing import open_job_storage
    from tests.fleet_helpers import write_checkpoint

    Cluster.objects.create(name="cpu-b")
    job = make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt")
    attempt, token = make_attempt(job)
    theirs = make_job(other_team, cluster, outsider, phase="running")
    _, other_token = make_attempt(theirs)
    owner_token, _ = ApiToken.issue(owner, "laptop")
    # A finished job of the same team with real files: its final checkpoint
    # and the model exported from it.
    done = make_job(team, cluster, owner, phase="succeeded", name="done")
    final = write_checkpoint(done, 40)
    webhook = Webhook.objects.create(team=team, url="https://hooks.example.com/x")
    given_up = webhook.deliveries.create(event_type="webhook.ping", payload={},
                                         status="failed", attempts=8)
    # The running job's attempt was profiled once (so a new profile may be
    # asked); the finished job has a trace file to download.
    JobAttempt.objects.filter(pk=attempt.pk).update(profile_request_id="feedc0de",
                                                    profile_steps=3)
    ProfileTrace.objects.create(job=job, attempt=attempt, request_id="feedc0de", start_step=5,
                                steps=3, rank=0, path="profiles/step-5-feedc0de/rank-0.json.gz")
    trace = write_trace(make_attempt(done, state=JobAttempt.State.SUCCEEDED)[0], 0)
    return World(
        job=job, attempt=attempt, worker_token=token, other_worker_token=other_token,
        quota=Quota.objects.get(team=team), node=Node.objects.get(name="cpu-a-0"),
        checkpoint=make_checkpoint(job, 100),
        artifact=export_final(done, final, open_job_storage(done), timezone.now()),
        owner_token=owner_token, stored_checkpoint=final, webhook=webhook, delivery=given_up,
        trace=trace,
    )


def client(persona, request, world) -> APIClient:
    if persona == "anonymous":
        return APIClient()
    if persona == "worker":
        return worker_client(world.worker_token)
    if persona == "other_worker":
        return worker_client(world.other_worker_token)
    if persona == "admin":
        return client_for(request.getfixturevalue("admin_user_"))
    return client_for(request.getfixturevalue(persona))


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize(("method", "path", "body", "expected"), ENDPOINTS,
                         ids=[f"{m.upper()} {p}" for m, p, _, _ in ENDPOINTS])
def test_the_authorization_matrix(request, world, persona, method, path, body, expected):
    url = path.format(w=world)
    resp = getattr(client(persona, request, world), method)(url, body, format="json")
    assert resp.status_code == expected[persona], (persona, method, url, resp.content[:300])


def api_routes_and_methods():
    """Every (route, method) the API answers, as the URL resolver and the view
    classes declare them; OPTIONS and HEAD come with GET from the framework."""
    from django.urls import get_resolver

    def walk(patterns, prefix=""):
        for p in patterns:
            if hasattr(p, "url_patterns"):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            else:
                yield prefix + str(p.pattern), p.callback

    for route, callback in walk(get_resolver().url_patterns):
        if not route.startswith("api/v1/"):
            continue
        view = getattr(callback, "view_class", None)
        if view is None:  # a function view declares no methods: no row can cover it
            yield route, "<function view>"
            continue
        for method in view.http_method_names:
            if method not in ("options", "head") and hasattr(view, method):
                yield route, method


def shape(route):
    return re.sub(r"<[^>]+>|\{[^}]+\}|vision", "X", route.split("?")[0].removeprefix("/"))


def uncovered(endpoints):
    served = {(shape(route), method) for route, method in api_routes_and_methods()}
    covered = {(shape(path), method) for method, path, _, _ in endpoints}
    return served - covered, covered - served


def test_the_matrix_covers_every_method_of_every_api_route():
    assert len(set(api_routes_and_methods())) >= 40
    missing, unknown = uncovered(ENDPOINTS)
    assert missing == set()
    assert unknown == set()  # a row for a route or method the API does not serve


def test_the_coverage_guard_catches_a_method_without_a_row():
    token_get = ("get", "/api/v1/tokens/{w.owner_token.pk}/")
    without = [row for row in ENDPOINTS if row[:2] != token_get]
    assert len(without) == len(ENDPOINTS) - 1
    assert uncovered(without) == ({("api/v1/tokens/X/", "get")}, set())
