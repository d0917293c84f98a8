"""schemathesis against /api/schema/: every operation, fuzzed as a team
member, an operator and nobody (and the worker endpoints with a real worker
token), on a live server over real PostgreSQL or SQLite, with every check
schemathesis runs on a response: no 5xx; every status, content type, header
and body as the schema documents it; schema-valid data accepted
(positive_data_acceptance) and schema-invalid data refused
(negative_data_rejection). So each constraint the server enforces on a field
or a query parameter is in the schema, where a generated client sees it.

What no schema can state is named below (NAMED_ELSEWHERE): a field that
names another object (a cluster, a team, a pool) or is judged against the
deployment or the world (a storage root, what a webhook's host resolves
to, the trainer's config, a pool's size). A schema-valid value there may
be a 400 on that field, and only on it.

Bounded to stay fast: a fixed number of examples per operation and mode
(valid and invalid data), derandomised so a run is repeatable, and no
shrinking. Path ids are half the time those of real rows, so the 200
bodies are checked too, not only the 404s. Node actions and token
deletes keep random ids: they would cordon the fleet or revoke the very
token the test calls with.
"""

from __future__ import annotations

import json
import re

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from accounts.models import ApiToken
from checkpoints.models import Checkpoint, ModelArtifact
from clusters.models import Node, NodeHealthEvent
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, JobEvent, Quota
from notifications.models import Webhook
from tests.api_factories import make_attempt, make_job

# A fuzz run over every operation: in `make test`, not the inner loop.
pytestmark = pytest.mark.slow

EXAMPLES = {GenerationMode.POSITIVE: 4, GenerationMode.NEGATIVE: 3}
# The five worker endpoints take the most free-form bodies (gpu, data): more
# examples each, still only a few hundred requests.
WORKER_EXAMPLES = 10
# Nobody is refused everywhere (401): a couple of examples show it.
ANONYMOUS_EXAMPLES = 1
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance,
          positive_data_acceptance, negative_data_rejection]
# Besides every GET, operations whose path ids may be pinned to real rows:
# the job actions, and a token delete pinned to a spare token.
PINNABLE = ("POST /api/v1/jobs/{id}/cancel/", "POST /api/v1/jobs/{id}/checkpoint/",
            "POST /api/v1/jobs/{id}/restart/", "POST /api/v1/jobs/{id}/profile/",
            "DELETE /api/v1/tokens/{id}/", "POST /api/v1/webhooks/{id}/ping/")
# Body fields whose valid values no OpenAPI 3.0 schema can state (see the
# docstring): a 400 naming only these is the server's answer to data that
# looks valid. Everything else a field or parameter must be is in the schema.
_NAMES = {"team", "cluster", "pool"}  # must name an object that exists (and is yours)
NAMED_ELSEWHERE = {
    "POST /api/v1/jobs/": _NAMES | {
        "eval",                                    # its pool, and which checkpoints
        "storage_uri",                             # under the deployment's storage roots
        "image", "env",                            # the cluster's image_allow, env_allow
        "hyperparameters",                         # the built-in trainer's config keys
        "num_nodes", "gpus_per_node", "world_size",  # the pool's size, their product
        "entrypoint", "args",                      # its first word; args need one
    },
    "POST /api/v1/quotas/": _NAMES | {"non_field_errors"},  # one quota per team and cluster
    "PATCH /api/v1/quotas/{id}/": _NAMES | {"non_field_errors"},
    "POST /api/v1/webhooks/": {"team", "url"},  # url: what its host resolves to
    "PATCH /api/v1/webhooks/{id}/": {"url"},
    # A worker's body names its own job, folder and profile request; `gpu`
    # and `data` are free-form objects, whose keys no OpenAPI 3.0 schema can
    # keep free of NUL (refused anywhere in a body: controlplane/lib/parsers.py).
    "POST /api/v1/worker/attempts/{attempt_id}/heartbeat": {"job_id", "gpu"},
    "POST /api/v1/worker/attempts/{attempt_id}/metrics": {"job_id"},
    "POST /api/v1/worker/attempts/{attempt_id}/checkpoints": {"job_id", "uri"},
    "POST /api/v1/worker/attempts/{attempt_id}/events": {"job_id", "data"},
    "POST /api/v1/worker/attempts/{attempt_id}/profiles": {"job_id", "uri", "request_id",
                                                            "rank"},
}


@pytest.fixture
def world(transactional_db, team, cluster, owner, operator, settings, tmp_path):
    # A fault injected on a real node id touches only this test's fleet.
    settings.LOCAL_FLEET_DIR = tmp_path / "fleet"
    job = make_job(team, cluster, owner, phase="running", storage_uri="/tmp/ckpt/vision/j")
    ended, _ = make_attempt(job, state=JobAttempt.State.FAILED)
    JobAttempt.objects.filter(pk=ended.pk).update(failure_class="code")
    attempt, worker_token = make_attempt(job)
    checkpoint = Checkpoint.objects.create(job=job, attempt=ended, step=10,
                                           uri="/tmp/ckpt/vision/j/step-10",
                                           state=Checkpoint.State.VERIFIED)
    artifact = ModelArtifact.objects.create(job=job, checkpoint=checkpoint, name="gpt",
                                            uri="/tmp/gpt")
    MetricPoint.objects.create(job=job, attempt=attempt, rank=0, name="loss", step=1, value=2.0,
                               time=job.created_at)
    job.record("Submitted", "for the fuzz", actor="test")
    node = Node.objects.filter(cluster=cluster).first()
    NodeHealthEvent.objects.create(node=node, kind=NodeHealthEvent.Kind.XID,
                                   severity=NodeHealthEvent.Severity.CRITICAL, message="xid 79")
    webhook = Webhook.objects.create(team=team, url="https://hooks.example.com/x",
                                     events=["job.failed"])
    ids = {"jobs": job.pk, "nodes": node.pk, "pools": node.pool_id, "clusters": cluster.pk,
           "quotas": Quota.objects.filter(team=team).first().pk, "checkpoints": checkpoint.pk,
           "artifacts": artifact.pk, "name": team.name, "attempt_id": attempt.pk,
           "webhooks": webhook.pk}
    assert JobEvent.objects.exists()
    personas = {"worker": (f"Bearer {worker_token}", ids), "nobody": (None, ids)}
    for name, user in (("member", owner), ("operator", operator)):
        spare, _ = ApiToken.issue(user, "spare")  # the one a fuzzed DELETE may revoke
        personas[name] = (f"Bearer {ApiToken.issue(user, 'fuzz')[1]}",
                          {**ids, "tokens": spare.pk})
    return personas


def _pinned(operation, ids) -> dict | None:
    """Real ids for the operation's path parameters, where that is safe."""
    label = f"{operation.method.upper()} {operation.path}"
    if operation.method.upper() != "GET" and label not in PINNABLE and "attempt_id" not in label:
        return None
    names = [p.name for p in operation.path_parameters]
    if not names:
        return None
    if "name" in names:
        return {"name": ids["name"]}
    if "attempt_id" in names:
        return {"attempt_id": ids["attempt_id"]}
    resource = operation.path.split("/")[3]  # /api/v1/<resource>/{id}/...
    return {"id": ids[resource]} if resource in ids else None


def _strategy(operation, mode, ids):
    free = operation.as_strategy(generation_mode=mode)
    pinned = _pinned(operation, ids)
    if pinned is None:
        return free
    return st.one_of(free, operation.as_strategy(generation_mode=mode, path_parameters=pinned))


def _named_elsewhere(operation, response) -> bool:
    """A 400 that names only fields whose valid values the schema cannot list."""
    fields = NAMED_ELSEWHERE.get(f"{operation.method.upper()} {operation.path}")
    if not fields or response.status_code != 400:
        return False
    try:
        named = {re.split(r"[.\[]", key, maxsplit=1)[0] for key in response.json()}
    except (ValueError, TypeError):
        return False
    return bool(named) and named <= fields


def _fuzz(operation, mode, base_url, auth, ids, failures, examples):
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=_strategy(operation, mode, ids))
    def run(case):
        headers = {"Authorization": auth} if auth else {}
        response = case.call(base_url=base_url, headers=headers, timeout=60)
        checks = CHECKS
        if _named_elsewhere(operation, response):
            checks = [c for c in CHECKS if c is not positive_data_acceptance]
        try:
            case.validate_response(response, checks=checks)
        except (AssertionError, BaseExceptionGroup) as exc:  # reported together below
            failures.setdefault(operation.label, f"{mode.value}: {exc}"[:3000])

    run()


def _operations(live_server, tag: str | None):
    # Fetched once, generously: a loaded machine takes a while to render it.
    raw = requests.get(f"{live_server.url}/api/schema/?format=json", timeout=300)
    raw.raise_for_status()
    schema = schemathesis.openapi.from_dict(json.loads(raw.content))
    for result in schema.get_all_operations():
        operation = result.ok()
        is_worker = "worker" in (operation.tags or [])
        if tag is None or (tag == "worker") == is_worker:
            yield operation


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("persona", "tag"), [("member", "people"), ("operator", "people"),
                                              ("worker", "worker"), ("nobody", None)])
def test_no_fuzzed_request_gets_a_server_error_or_breaks_the_schema(live_server, world,
                                                                      persona, tag):
    failures: dict[str, str] = {}
    count = 0
    auth, ids = world[persona]
    for operation in _operations(live_server, tag):
        count += 1
        is_worker = "worker" in (operation.tags or [])
        for mode, examples in EXAMPLES.items():
            if persona == "nobody":
                examples = ANONYMOUS_EXAMPLES
            elif is_worker:
                examples = WORKER_EXAMPLES
            _fuzz(operation, mode, live_server.url, auth, ids, failures, examples)
    assert count >= (4 if tag == "worker" else 39), f"only {count} operations in the schema"
    assert not failures, "\n\n".join(f"{op}\n{why}" for op, why in sorted(failures.items()))
