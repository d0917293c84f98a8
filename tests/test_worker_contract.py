"""The worker contract (worker_image/regatta/contract.py) pinned from both
sides: what the control plane and a provider put in a rank's environment is
what the SDK's own reader gets back, an exit code the SDK writes is the one
the control plane classifies, each report body the SDK builds passes the
server's checks made from the same table (and the table's bounds are what
the server, its fast path and its schema enforce), and no other module
spells a launch name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import torch
from django.conf import settings
from django.utils import timezone
from regatta import contract
from regatta import manifest as mf
from regatta.checkpoint import Checkpointer
from regatta.launch import Launch
from regatta.profiling import Profiler
from regatta.reporting import Reporter
from regatta.reporting import from_env as reporter_from_env
from regatta.status import write_status
from regatta.storage import open_storage

from checkpoints.models import Checkpoint
from clusters.providers.base import NodeProcess
from clusters.providers.local import attempts as local_attempts
from jobs.checkpointing import job_checkpoint_uri
from jobs.metrics.models import MetricPoint
from jobs.models import JobAttempt, JobEvent, RankStatus
from jobs.profiling.models import ProfileTrace
from jobs.reconcile import reconcile_job_unlocked
from jobs.recovery import detect
from jobs.worker_api import tokens
from jobs.worker_api.fields import Fields
from jobs.worker_api.views import fast
from jobs.worker_api.views import schema as worker_schema
from tests.api_factories import make_attempt, make_job, worker_client
from tests.fleet_helpers import (
    heartbeat,
    later,
    memory_cluster,
    provider_of,
    running_job,
    submit,
    team_with_quota,
    write_checkpoint,
)
from tests.fleet_helpers import launch as fleet_launch

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("controlplane", "accounts", "clusters", "jobs", "checkpoints", "notifications",
           "frontend", "cli", "worker_image/regatta", "worker_image/trainer")
CONTRACT = ROOT / "worker_image" / "regatta" / "contract.py"


@pytest.fixture
def mem_cluster(db, fleet_dirs):
    return memory_cluster()


def node_env(job, attempt, tmp_path) -> tuple[dict, object]:
    """Rank 0's environment on its node: the launch the control plane asked
    for, as the local provider hands it to its node, plus torchrun's."""
    request = provider_of(job.cluster).attempt(attempt.provider_ref).request
    placement = min(request.placements, key=lambda p: p.node_rank)
    node_dir = tmp_path / "attempt" / f"node-{placement.node_rank}"
    env = local_attempts.node_environment(tmp_path / "fleet", tmp_path / "attempt", request,
                                          placement.node, node_dir, {})
    return {**env, contract.RANK: "0", contract.WORLD_SIZE: str(job.world_size),
            contract.LOCAL_RANK: "0"}, placement


def test_a_launch_the_control_plane_builds_is_read_back_by_the_sdk(mem_cluster, tmp_path):
    job = submit(mem_cluster, team_with_quota(mem_cluster))
    fleet_launch(job, timezone.now())
    attempt = job.attempts.get()
    env, placement = node_env(job, attempt, tmp_path)

    launch = Launch.from_env(env)

    assert launch.url == settings.PUBLIC_URL and launch.managed
    claim = tokens.verify(launch.token)
    assert (claim.attempt_id, claim.job_id) == (attempt.id, job.id)
    assert (launch.job_id, launch.attempt_id) == (str(job.id), str(attempt.id))
    assert launch.checkpoint_uri == job_checkpoint_uri(job)
    assert (launch.resume_step, launch.resume_uri) == (contract.RESUME_NONE, "")
    assert launch.checkpoint_every == job.effective_checkpoint_every
    assert launch.node == placement.node
    assert launch.status_dir == str(tmp_path / "attempt" / "node-0" / "status")
    assert (launch.rank, launch.world_size) == (0, job.world_size)
    # Every name the control plane owns reaches the rank (an eval run's two
    # only on an eval run).
    owned = {v.name for v in contract.LAUNCH_ENV.values() if v.set_by == contract.CONTROL_PLANE}
    assert owned - set(env) == {contract.EVAL_STEP, contract.PARENT_JOB_ID}
    # The SDK's reporter, built from what it read, reports as this attempt.
    reporter = reporter_from_env(launch.env(), launch.rank, 5.0)
    assert reporter.base == f"/api/v1/worker/attempts/{attempt.id}"
    assert reporter.job_id == str(job.id) and reporter.node == placement.node


def test_a_relaunch_tells_the_sdk_the_checkpoint_it_resumes_from(mem_cluster, tmp_path):
    now = timezone.now()
    job, attempt = running_job(mem_cluster, team_with_quota(mem_cluster), now)
    checkpoint = write_checkpoint(job, 10, attempt, created_at=later(now, 5))
    heartbeat(attempt, 12, later(now, 8))
    preempted = tuple({"rank": r, "exit_code": contract.EXIT_PREEMPTED,
                       "failure_class": contract.PREEMPTED} for r in range(2))
    for placement in attempt.placements.select_related("node"):
        provider_of(mem_cluster).exit_node(attempt.provider_ref, placement.node.name,
                                           exit_code=contract.EXIT_PREEMPTED, ranks=preempted)
    reconcile_job_unlocked(job.id, later(now, 10))
    second = job.attempts.get(number=2)
    env, _ = node_env(job, second, tmp_path)

    launch = Launch.from_env(env)

    assert (launch.resume_step, launch.resume_uri) == ("10", checkpoint.uri)
    assert launch.attempt_id == str(second.id)


@pytest.mark.parametrize("code", sorted(contract.FAILURE_CLASS))
def test_an_exit_code_the_sdk_writes_is_the_class_the_control_plane_gives_it(code, tmp_path):
    status = tmp_path / "status"
    for rank in (0, 1):
        write_status(Launch(rank=rank, status_dir=str(status), job_id="7", attempt_id="3"),
                     code, None if code == contract.EXIT_OK else "stopped", 12)
    ranks = local_attempts.rank_records(status)
    proc = NodeProcess(node="n0", node_rank=0, running=False, exit_code=code, ranks=ranks)

    found = detect.node_class(proc, ranks_per_node=2)

    assert [r["failure_class"] for r in ranks] == [contract.FAILURE_CLASS[code]] * 2
    assert found == contract.FAILURE_CLASS[code]


# --- report bodies -------------------------------------------------------------

class ClientHttp:
    """The reporter's transport through Django's test client: the server's
    real authenticators, views, checks and writers, without a socket."""

    def __init__(self, token: str) -> None:
        self.client = worker_client(token)

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        resp = self.client.post(path, json.dumps(body), content_type="application/json")
        return resp.status_code, resp.content

    def close(self) -> None:
        pass


def test_every_body_the_sdk_builds_passes_the_servers_checks(db, fleet_dirs, team, cluster):
    job = make_job(team, cluster, phase="running")
    attempt, token = make_attempt(job)
    JobAttempt.objects.filter(pk=attempt.pk).update(profile_request_id="p1", profile_steps=2)
    storage = open_storage(job_checkpoint_uri(job))
    reporter = Reporter("http://testserver", token, str(attempt.pk), rank=1, node="n1",
                        heartbeat_interval_s=1.0, job_id=str(job.pk))
    reporter.http = ClientHttp(token)

    reporter.update_status(step=4, samples_per_s=8.0, tokens_per_s=512.0, step_time_s=0.25)
    reporter.metric("loss", 4, 2.5)
    reporter.event("started", "fresh start", {"params": 1000})
    manifest = mf.build_manifest(4, {"w.pt": {"bytes": 3, "sha256": "00" * 32}})
    Checkpointer._report_commit(SimpleNamespace(reporter=reporter, storage=storage), 4,
                                {"w.pt": {"bytes": 3}}, manifest, 0.5, 0.125, False, None)
    profiler = Profiler(1, torch.device("cpu"), storage, reporter)
    profiler.begin("p1", 2, start_step=3)
    torch.ones(4).add_(1)
    profiler.finish(4)
    reporter._heartbeat()
    reporter._drain()

    assert not [k for k in reporter.sent if k.endswith("_refused")], reporter.sent
    assert set(reporter.sent) == {b.endpoint for b in contract.REPORTS}
    assert RankStatus.objects.get(attempt=attempt, rank=1).step == 4
    assert MetricPoint.objects.filter(attempt_id=attempt.pk, name="loss", step=4).exists()
    assert JobEvent.objects.filter(job=job, kind="TrainerStarted").exists()
    assert Checkpoint.objects.get(job=job, step=4).blocking_seconds == 0.125
    assert ProfileTrace.objects.filter(attempt=attempt, request_id="p1", rank=1).exists()


def test_a_status_the_heartbeat_has_no_field_for_is_refused_where_it_is_set(db, team, cluster):
    job = make_job(team, cluster, phase="running")
    attempt, token = make_attempt(job)
    reporter = Reporter("http://testserver", token, str(attempt.pk), rank=0, node="n0",
                        heartbeat_interval_s=1.0)

    with pytest.raises(ValueError, match="heartbeat: no field"):
        reporter.update_status(step=1, loss=2.0)


def _extreme(field: contract.Field, past: bool = False):
    """The field's largest value the table allows, or (`past`) one beyond
    it (None where the table sets no upper bound)."""
    if field.type is int:
        return field.maximum + past
    if field.type is float:
        if field.maximum is None:
            return None if past else 1.5
        return field.maximum * 2 if past else field.maximum
    if field.type is str:
        if past:
            return "a" * (field.max_length + 1)
        return "a" if field.pattern else "a" * field.max_length
    return None if past else {list: [], dict: {}, bool: True}[field.type]


def _below(field: contract.Field):
    """One below the field's lower bound, or None where it has none."""
    if field.type in (int, float) and field.minimum is not None:
        return field.minimum - 1
    if field.type is str and field.min_length:
        return ""
    return None


def _valid(body: contract.Body) -> dict:
    return {f.name: _extreme(f) for f in body.fields if f is not contract.JOB_ID_FIELD}


@pytest.mark.parametrize("body", [*contract.REPORTS, contract.METRIC_POINT],
                         ids=lambda b: f"{b.endpoint}-{len(b.fields)}")
def test_the_servers_reader_keeps_each_bound_of_the_table(body):
    ok = Fields(_valid(body), known=tuple(body.names))
    ok.read(body)
    assert ok.errors == {}
    for field in body.fields:
        if field is contract.JOB_ID_FIELD:
            continue
        for wrong in (_extreme(field, past=True), _below(field)):
            if wrong is not None:
                f = Fields({**_valid(body), field.name: wrong}, known=tuple(body.names))
                f.read(body)
                assert set(f.errors) == {field.name}, (field, wrong)
        absent = Fields({k: v for k, v in _valid(body).items() if k != field.name},
                        known=tuple(body.names))
        value = absent.read(body)[field.name]
        assert set(absent.errors) == ({field.name} if field.required else set()), field
        if not field.required:
            assert value == field.default, field
    unknown = Fields({**_valid(body), "colour": 1}, known=tuple(body.names))
    unknown.read(body)
    assert set(unknown.errors) == {"colour"}


def test_the_fast_path_takes_exactly_the_points_the_table_allows():
    point = _valid(contract.METRIC_POINT)
    decode = fast._decode_metrics
    assert decode(json.dumps({"points": [point]}).encode()).points[0].rank == point["rank"]
    for field in contract.METRIC_POINT.fields:
        for wrong in (_extreme(field, past=True), _below(field)):
            if wrong is not None:
                with pytest.raises(msgspec.ValidationError):
                    decode(json.dumps({"points": [{**point, field.name: wrong}]}).encode())


@pytest.mark.parametrize(("serializer", "body"), [
    (worker_schema.Heartbeat, contract.HEARTBEAT),
    (worker_schema.MetricBatch, contract.METRIC_BATCH),
    (worker_schema.MetricPointIn, contract.METRIC_POINT),
    (worker_schema.CheckpointCommitted, contract.CHECKPOINT),
    (worker_schema.TrainerEvent, contract.EVENT),
    (worker_schema.ProfileTraceWritten, contract.PROFILE),
])
def test_the_schema_documents_each_body_as_the_table_has_it(serializer, body):
    fields = serializer().get_fields()
    assert set(fields) == body.names
    for field in body.fields:
        documented = fields[field.name]
        assert documented.required == field.required, field
        for ours, theirs in (("minimum", "min_value"), ("maximum", "max_value"),
                             ("max_length", "max_length")):
            if getattr(field, ours) is not None and field.type is not list:
                assert getattr(documented, theirs) == getattr(field, ours), (field, theirs)


# --- each name written once ---------------------------------------------------

_NAME = re.compile(r"\bREGATTA_[A-Z][A-Z0-9_]*")


def _strings(tree: ast.AST):
    """String constants of a module, docstrings left out (they may name the
    contract in prose)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs:
            yield node


def spelled_elsewhere() -> dict[str, list[str]]:
    """Each module outside the contract that spells one of its names."""
    names = set(contract.LAUNCH_ENV)
    found: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == CONTRACT or "migrations" in path.parts:
                continue
            for node in _strings(ast.parse(path.read_text(), str(path))):
                for name in set(_NAME.findall(node.value)) & names:
                    found.setdefault(name, []).append(
                        f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_but_the_contract_spells_a_launch_name():
    found = spelled_elsewhere()
    assert not found, "use regatta.contract's names instead:\n" + "\n".join(
        f"  {name}: {', '.join(where)}" for name, where in sorted(found.items()))


def test_every_launch_name_says_who_sets_it_who_reads_it_and_what_it_means():
    protocol = (ROOT / "docs" / "trainer-protocol.md").read_text()
    for var in contract.LAUNCH_ENV.values():
        assert var.set_by and var.read_by and var.meaning, var
        assert f"`{var.name}`" in protocol or var.set_by == contract.TORCHRUN, var.name
