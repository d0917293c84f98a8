"""A job that runs a program of its own (an `entrypoint`): free-form
hyperparameters, args and env of its own; it finishes when every rank exits
0 unless it promised its final checkpoint; every launch names the newest
verified checkpoint; a program that sends no heartbeats shows running and is
watched by its processes. The fleet is the in-memory test double
(tests/support/memory_provider.py)."""

import json

import pytest
from django.utils import timezone

from checkpoints.models import ModelArtifact
from jobs.models import NO_HEARTBEATS, JobAttempt, JobEvent, Phase, TrainingJob
from jobs.reconcile import reconcile_job_unlocked
from tests.fleet_helpers import (
    heartbeat,
    kinds,
    later,
    launch,
    lose_node,
    memory_cluster,
    nodes_of,
    provider_of,
    submit,
    team_with_quota,
    write_checkpoint,
)

from .test_api_submit import URL, messages, spec

PROGRAM = ["/opt/code/train_ddp.py"]


# --- the spec ---------------------------------------------------------------
def test_a_program_takes_hyperparameters_args_and_env_of_its_own(api, owner, team, pool):
    resp = api(owner).post(URL, spec(
        entrypoint=PROGRAM, args=["--epochs", "3", ""],
        hyperparameters={"steps": 40, "lr": 3e-4, "layers": [64, 64], "note": None},
        env={"WANDB_MODE": "offline", "NCCL_DEBUG": "INFO", "HF_HOME": "/cache/hf"},
    ), format="json")

    assert resp.status_code == 201, resp.content
    job = TrainingJob.objects.get()
    assert job.args == ["--epochs", "3", ""]
    assert job.hyperparameters["steps"] == 40
    assert job.env["HF_HOME"] == "/cache/hf"
    assert job.completion == TrainingJob.Completion.EXIT
    assert resp.data["completion"] == "exit" and resp.data["args"] == job.args


def test_the_built_in_trainer_still_promises_its_final_checkpoint(api, owner, team, pool):
    resp = api(owner).post(URL, spec(), format="json")
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.get().completion == TrainingJob.Completion.CHECKPOINT


def test_a_program_may_promise_its_final_checkpoint(api, owner, team, pool):
    resp = api(owner).post(URL, spec(entrypoint=PROGRAM, completion="checkpoint"), format="json")
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.get().completion == "checkpoint"


BAD_PROGRAM_SPECS = [
    ("args", {"args": ["--steps", "3"]}),  # no entrypoint: the trainer takes hyperparameters
    ("args", {"entrypoint": PROGRAM, "args": "--steps 3"}),
    ("args", {"entrypoint": PROGRAM, "args": ["--steps", 3]}),
    ("env", {"entrypoint": PROGRAM, "env": {"RANK": "0"}}),
    ("env", {"entrypoint": PROGRAM, "env": {"REGATTA_TOKEN": "x"}}),
    ("env", {"entrypoint": PROGRAM, "env": {"MASTER_ADDR": "10.0.0.1"}}),
    ("env", {"entrypoint": PROGRAM, "env": {"BAD NAME": "x"}}),
    ("env", {"entrypoint": PROGRAM, "env": {"N": 3}}),
    ("env", {"entrypoint": PROGRAM, "env": ["A=1"]}),
    ("completion", {"entrypoint": PROGRAM, "completion": "whenever"}),
    ("completion", {"entrypoint": PROGRAM, "completion": 1}),
    ("hyperparameters", {"entrypoint": PROGRAM, "hyperparameters": {"blob": "x" * 70_000}}),
    ("hyperparameters", {"entrypoint": PROGRAM, "hyperparameters": [1, 2]}),
    # torchrun's own options, were they read as such: more processes than
    # GPUs, another rendezvous, a shell instead of Python.
    ("entrypoint", {"entrypoint": ["--nproc_per_node=8", "train.py"]}),
    ("entrypoint", {"entrypoint": ["--master_addr=10.9.9.9", "--master_port=1", "train.py"]}),
    ("entrypoint", {"entrypoint": ["--rdzv_endpoint=evil:29400", "train.py"]}),
    ("entrypoint", {"entrypoint": ["--no-python", "/bin/sh", "-c", "id"]}),
    ("entrypoint", {"entrypoint": ["-m", "mypackage.train"]}),
    ("entrypoint", {"entrypoint": ["", "train.py"]}),
]


@pytest.mark.parametrize(("field", "overrides"), BAD_PROGRAM_SPECS,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_PROGRAM_SPECS)])
def test_a_bad_program_spec_is_refused_naming_the_field(api, owner, team, pool, field,
                                                        overrides):
    resp = api(owner).post(URL, spec(**overrides), format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.data, resp.data
    assert messages(resp.data[field]) and all(messages(resp.data[field]))
    assert not TrainingJob.objects.exists()


def test_an_eval_entrypoint_that_starts_with_a_flag_is_refused(api, owner, team, pool):
    resp = api(owner).post(URL, spec(entrypoint=PROGRAM, eval={
        "every_checkpoint": True, "pool": pool.name,
        "entrypoint": ["--nproc_per_node=8", "eval.py"]}), format="json")
    assert resp.status_code == 400, resp.content
    assert "torchrun" in " ".join(messages(resp.data["eval"]["entrypoint"]))
    assert not TrainingJob.objects.exists()


def test_a_reserved_name_says_why(api, owner, team, pool):
    resp = api(owner).post(URL, spec(entrypoint=PROGRAM, env={"WORLD_SIZE": "8"}), format="json")
    assert "set by the launch" in " ".join(messages(resp.data["env"]))


# --- the run ----------------------------------------------------------------
@pytest.fixture
def mem_cluster(db, fleet_dirs):
    return memory_cluster()


@pytest.fixture
def vision(mem_cluster):
    return team_with_quota(mem_cluster)


def program(cluster, team, **kw):
    kw.setdefault("completion", TrainingJob.Completion.EXIT)
    return submit(cluster, team, entrypoint=PROGRAM, hyperparameters={"steps": 40}, **kw)


def test_a_program_that_exits_0_without_a_checkpoint_succeeds(mem_cluster, vision):
    job = program(mem_cluster, vision)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    provider_of(mem_cluster).finish(attempt.provider_ref)

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, kinds(job)
    assert "FinalCheckpointMissing" not in kinds(job)
    done = JobEvent.objects.get(job=job, kind="Succeeded")
    assert done.message == "every rank exited 0"
    assert done.evidence["completion"] == "exit" and done.evidence["checkpoint_step"] is None
    assert not ModelArtifact.objects.filter(job=job).exists()


def test_a_program_that_promised_its_final_checkpoint_is_held_to_it(mem_cluster, vision):
    job = program(mem_cluster, vision, completion=TrainingJob.Completion.CHECKPOINT)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 40, later(now, 2))
    provider_of(mem_cluster).finish(attempt.provider_ref)

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    assert job.phase == Phase.RESTARTING
    assert "FinalCheckpointMissing" in kinds(job)


def test_a_program_that_left_checkpoints_has_its_newest_exported(mem_cluster, vision):
    job = program(mem_cluster, vision)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 30, later(now, 2))
    write_checkpoint(job, 30, attempt, created_at=later(now, 3))
    provider_of(mem_cluster).finish(attempt.provider_ref)

    reconcile_job_unlocked(job.id, later(now, 5))

    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, kinds(job)
    assert job.current_step == 30
    assert ModelArtifact.objects.get(job=job).checkpoint.step == 30


def test_the_launch_carries_the_programs_args_env_and_resume_point(mem_cluster, vision):
    job = program(mem_cluster, vision, args=["--epochs", "3"],
                  env={"WANDB_MODE": "offline", "REGATTA_URL": "sneaked-in-before-validation"})
    now = timezone.now()
    launch(job, now)
    first = job.attempts.get()
    request = provider_of(mem_cluster).attempt(first.provider_ref).request
    assert request.command == (*PROGRAM, "--epochs", "3")
    assert request.env["WANDB_MODE"] == "offline"
    assert request.env["REGATTA_URL"] != "sneaked-in-before-validation"  # the contract wins
    assert request.env["REGATTA_RESUME_STEP"] == "none" and request.env["REGATTA_RESUME_URI"] == ""
    assert json.loads(request.env["REGATTA_CONFIG"])["steps"] == 40
    assert request.env["REGATTA_CHECKPOINT_EVERY"] == str(job.effective_checkpoint_every)

    heartbeat(first, 12, later(now, 2))
    reconcile_job_unlocked(job.id, later(now, 2))
    ckpt = write_checkpoint(job, 10, first, created_at=later(now, 3))
    lose_node(mem_cluster, nodes_of(first)[1], first.provider_ref)
    for t in (6, 7, 8, 30):
        reconcile_job_unlocked(job.id, later(now, t))

    second = job.attempts.get(number=2)
    request = provider_of(mem_cluster).attempt(second.provider_ref).request
    assert request.env["REGATTA_RESUME_STEP"] == "10"
    assert request.env["REGATTA_RESUME_URI"] == ckpt.uri
    assert request.command == (*PROGRAM, "--epochs", "3")


def test_a_program_that_sends_no_heartbeats_shows_running_and_is_not_a_hang(mem_cluster,
                                                                            vision):
    job = program(mem_cluster, vision)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()

    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.STARTING  # an SDK program may still be importing

    # Far past every heartbeat deadline: alive processes, never a report.
    reconcile_job_unlocked(job.id, later(now, 25))
    reconcile_job_unlocked(job.id, later(now, 900))

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.phase == Phase.RUNNING and job.heartbeats_missing
    assert attempt.state == JobAttempt.State.RUNNING
    running = JobEvent.objects.get(job=job, kind="Running")
    assert "no heartbeats" in running.message and running.evidence["heartbeats"] is False
    assert job.restart_counts == {}

    # Its first heartbeat ends the note; from then on it is held to the deadlines.
    heartbeat(attempt, 3, later(now, 901))
    reconcile_job_unlocked(job.id, later(now, 901))
    job.refresh_from_db()
    assert not job.heartbeats_missing
    assert not [c for c in job.conditions if c["type"] == NO_HEARTBEATS]


def test_an_export_that_fails_is_an_event_and_the_job_still_succeeds(mem_cluster, vision,
                                                                     settings, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("the registry cannot be made under a file")
    settings.ARTIFACT_ROOT = blocker / "artifacts"
    job = program(mem_cluster, vision)
    now = timezone.now()
    launch(job, now)
    attempt = job.attempts.get()
    heartbeat(attempt, 30, later(now, 2))
    write_checkpoint(job, 30, attempt, created_at=later(now, 3))
    provider_of(mem_cluster).finish(attempt.provider_ref)

    reconcile_job_unlocked(job.id, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 120))  # long after: no hang, no rerun

    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED, kinds(job)
    failed = JobEvent.objects.get(job=job, kind="ExportFailed")
    assert failed.evidence["step"] == 30 and failed.evidence["error"]
    assert "not exported" in failed.message
    assert not ModelArtifact.objects.filter(job=job).exists()
    assert job.attempts.count() == 1 and job.restart_counts == {}
