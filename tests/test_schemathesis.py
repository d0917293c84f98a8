"""schemathesis against /api/schema/: every operation, fuzzed as a team
member and as an operator (and the worker endpoints with a real worker
token), on a live server over real PostgreSQL or SQLite. Any 5xx, or any
documented response whose body does not match the schema, fails the test.

Bounded to stay fast: a fixed number of examples per operation and mode
(valid and invalid data), derandomised so a run is repeatable, and no
shrinking. Path ids are half the time those of real rows, so the 200
bodies are checked too, not only the 404s. Node actions and token
deletes keep random ids: they would cordon the fleet or revoke the very
token the test calls with.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from accounts.models import ApiToken
from checkpoints.models import Checkpoint, ModelArtifact
from clusters.models import Node, NodeHealthEvent
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, JobEvent, Quota
from notifications.models import Webhook
from tests.api_factories import make_attempt, make_job

# A fuzz run over every operation: in `make test`, not the inner loop.
pytestmark = pytest.mark.slow

EXAMPLES = {GenerationMode.POSITIVE: 3, GenerationMode.NEGATIVE: 3}
# The five worker endpoints take the most free-form bodies (gpu, data): more
# examples each, still only a few hundred requests.
WORKER_EXAMPLES = 10
CHECKS = [not_a_server_error, response_schema_conformance]
# Besides every GET, operations whose path ids may be pinned to real rows:
# the job actions, and a token delete pinned to a spare token.
PINNABLE = ("POST /api/v1/jobs/{id}/cancel/", "POST /api/v1/jobs/{id}/checkpoint/",
            "POST /api/v1/jobs/{id}/restart/", "POST /api/v1/jobs/{id}/profile/",
            "DELETE /api/v1/tokens/{id}/", "POST /api/v1/webhooks/{id}/ping/")


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
    personas = {"worker": (f"Bearer {worker_token}", ids)}
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


def _fuzz(operation, mode, base_url, auth, ids, failures):
    examples = WORKER_EXAMPLES if "worker" in (operation.tags or []) else EXAMPLES[mode]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=_strategy(operation, mode, ids))
    def run(case):
        response = case.call(base_url=base_url, headers={"Authorization": auth}, timeout=30)
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, BaseExceptionGroup) as exc:  # reported together below
            failures.setdefault(operation.label, f"{mode.value}: {exc}"[:3000])

    run()


def _operations(live_server, tag: str | None):
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json")
    for result in schema.get_all_operations():
        operation = result.ok()
        is_worker = "worker" in (operation.tags or [])
        if (tag == "worker") == is_worker:
            yield operation


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("persona", "tag"), [("member", None), ("operator", None),
                                              ("worker", "worker")])
def test_no_fuzzed_request_gets_a_server_error_or_breaks_the_schema(live_server, world,
                                                                      persona, tag):
    failures: dict[str, str] = {}
    count = 0
    auth, ids = world[persona]
    for operation in _operations(live_server, tag):
        count += 1
        for mode in EXAMPLES:
            _fuzz(operation, mode, live_server.url, auth, ids, failures)
    assert count >= (4 if tag else 39), f"only {count} operations in the schema"
    assert not failures, "\n\n".join(f"{op}\n{why}" for op, why in sorted(failures.items()))
