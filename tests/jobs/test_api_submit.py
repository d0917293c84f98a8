"""Submitting a job: a valid spec is stored pending with its Submitted event
and a reconcile enqueued; a bad one gets 400 naming the field and writes
nothing."""

import json

import pytest

from jobs.models import JobEvent, TrainingJob

URL = "/api/v1/jobs/"


def messages(errors) -> list[str]:
    """A field's messages, also from a list's per-item errors."""
    if isinstance(errors, dict):
        return [m for value in errors.values() for m in messages(value)]
    if isinstance(errors, list):
        return [m for value in errors for m in messages(value)]
    return [str(errors)]


def spec(**overrides):
    body = {"name": "gpt-tiny", "cluster": "cpu-a", "num_nodes": 2, "gpus_per_node": 2,
            "hyperparameters": {"model": "nano", "max_steps": 20}}
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def test_it_submits_a_job_pending_with_an_event_and_a_reconcile(
    api, owner, team, pool, django_capture_on_commit_callbacks, settings
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        resp = api(owner).post(URL, spec(world_size=4, strategy="fsdp"), format="json")
    assert resp.status_code == 201, resp.content
    job = TrainingJob.objects.get()
    assert resp.data["id"] == job.pk
    assert (job.phase, job.team, job.pool, job.created_by) == ("pending", team, pool, owner)
    assert (job.num_nodes, job.gpus_per_node, job.world_size, job.strategy) == (2, 2, 4, "fsdp")
    # In the team's own folder under the default storage root.
    assert job.storage_uri == str(settings.CHECKPOINT_ROOT / "vision" / f"job-{job.pk}")
    assert resp.data["storage_uri"] == job.storage_uri
    assert resp.data["url"].endswith(f"/api/v1/jobs/{job.pk}/")
    assert resp.data["team"] == "vision" and resp.data["cluster"] == "cpu-a"
    event = JobEvent.objects.get(job=job)
    assert (event.kind, event.actor, event.to_phase) == ("Submitted", "user:olivia", "pending")
    assert len(callbacks) == 1


def test_the_reconcile_reaches_the_real_broker_on_commit(
    api, owner, django_capture_on_commit_callbacks
):
    from controlplane.redis_client import get_redis

    redis = get_redis()
    redis.delete("celery")
    with django_capture_on_commit_callbacks(execute=True):
        resp = api(owner).post(URL, spec(), format="json")
    messages = [json.loads(m) for m in redis.lrange("celery", 0, -1)]
    sent = [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages]
    assert ("jobs.tasks.reconcile_job", f"({resp.data['id']},)") in sent


def test_an_operator_may_submit_for_any_team(api, operator, other_team, cluster):
    resp = api(operator).post(URL, spec(team="speech"), format="json")
    assert resp.status_code == 201, resp.content
    assert TrainingJob.objects.get().team == other_team


def test_a_member_of_several_teams_must_name_one(api, owner, other_team, cluster):
    other_team.members.add(owner)
    resp = api(owner).post(URL, spec(), format="json")
    assert resp.status_code == 400
    assert "team" in resp.data
    resp = api(owner).post(URL, spec(team="speech"), format="json")
    assert resp.status_code == 201


def test_it_keeps_the_given_storage_uri_and_defaults(api, owner, cluster, settings):
    settings.STORAGE_ROOTS = ["s3://bucket-a/runs"]
    resp = api(owner).post(URL, spec(storage_uri="s3://bucket-a/runs/vision/gpt"),
                           format="json")
    job = TrainingJob.objects.get(pk=resp.data["id"])
    assert job.storage_uri == "s3://bucket-a/runs/vision/gpt"
    assert job.restart_budgets == {"code": 0, "transient": 3, "hardware": 5, "preempted": 10,
                                   "hang": 3, "process": 3}
    assert (job.budget_reset_steps, job.budget_reset_minutes) == (1000, 60)


def test_it_takes_a_budget_window_and_shows_it(api, owner, cluster):
    resp = api(owner).post(URL, spec(budget_reset_steps=0, budget_reset_minutes=30),
                           format="json")
    assert resp.status_code == 201, resp.content
    assert (resp.data["budget_reset_steps"], resp.data["budget_reset_minutes"]) == (0, 30)
    assert resp.data["restarts"]["hardware"] == {"spent": 0, "budget": 5, "in_all": 0}


BAD_SPECS = [
    ("world_size", {"world_size": 3}),
    ("gpus_per_node", {"gpus_per_node": 3}),
    ("cluster", {"cluster": "nowhere"}),
    ("num_nodes", {"num_nodes": 0}),
    ("num_nodes", {"num_nodes": -1}),
    ("num_nodes", {"num_nodes": 10**9}),
    ("num_nodes", {"num_nodes": 5}),  # the pool has 4: it could never be placed
    ("num_nodes", {"num_nodes": "two"}),
    ("num_nodes", {"num_nodes": "2"}),
    ("num_nodes", {"num_nodes": True}),
    ("num_nodes", {"num_nodes": 1.5}),
    ("gpus_per_node", {"gpus_per_node": None}),
    ("name", {"name": ""}),
    ("name", {"name": ...}),
    ("name", {"name": "x" * 101}),
    ("name", {"name": 7}),
    ("cluster", {"cluster": ...}),
    ("pool", {"pool": "nope"}),
    ("team", {"team": "speech"}),  # not the caller's team
    ("team", {"team": "ghosts"}),
    ("strategy", {"strategy": "horovod"}),
    ("checkpoint_policy", {"checkpoint_policy": "sometimes"}),
    ("checkpoint_every_steps", {"checkpoint_every_steps": 0}),
    ("checkpoint_every_steps", {"checkpoint_every_steps": 2_000_000}),
    ("keep_last", {"keep_last": 101}),
    ("priority", {"priority": 5000}),
    ("spot_allowed", {"spot_allowed": "yes"}),
    ("entrypoint", {"entrypoint": "python train.py"}),
    ("entrypoint", {"entrypoint": ["python", 3]}),
    ("restart_budgets", {"restart_budgets": {"cosmic_rays": 1}}),
    ("restart_budgets", {"restart_budgets": {"hardware": 101}}),
    ("restart_budgets", {"restart_budgets": {"hardware": "5"}}),
    ("budget_reset_steps", {"budget_reset_steps": -1}),
    ("budget_reset_steps", {"budget_reset_steps": "1000"}),
    ("budget_reset_steps", {"budget_reset_steps": 10**9}),
    ("budget_reset_minutes", {"budget_reset_minutes": 600_000}),
    ("budget_reset_minutes", {"budget_reset_minutes": 1.5}),
    ("budget_reset_minutes", {"budget_reset_minutes": None}),
    ("hyperparameters", {"hyperparameters": {"learning_rate": 0.1}}),
    ("hyperparameters", {"hyperparameters": {"max_steps": 10, "warmup_steps": 50}}),
    ("hyperparameters", {"hyperparameters": [1, 2]}),
    ("storage_uri", {"storage_uri": "ftp://somewhere"}),
    ("colour", {"colour": "blue"}),
]


@pytest.mark.parametrize(("field", "overrides"), BAD_SPECS,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_SPECS)])
def test_it_refuses_a_bad_spec_naming_the_field_and_writes_nothing(
    api, owner, other_team, cluster, field, overrides
):
    resp = api(owner).post(URL, spec(**overrides), format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.data, resp.data
    assert messages(resp.data[field]) and all(messages(resp.data[field]))
    assert not TrainingJob.objects.exists()
    assert not JobEvent.objects.exists()


def test_the_messages_say_what_is_wrong(api, owner, cluster):
    client = api(owner)
    resp = client.post(URL, spec(world_size=3), format="json")
    assert "must equal num_nodes × gpus_per_node = 2 × 2 = 4" in resp.data["world_size"][0]
    resp = client.post(URL, spec(cluster="nowhere"), format="json")
    assert "unknown cluster" in resp.data["cluster"][0]
    resp = client.post(URL, spec(gpus_per_node=8), format="json")
    assert "have 2" in resp.data["gpus_per_node"][0]
    resp = client.post(URL, spec(hyperparameters={"learning_rate": 0.1}), format="json")
    assert "learning_rate" in resp.data["hyperparameters"][0]


def test_the_moe_preset_is_accepted_and_a_bad_expert_knob_is_refused_by_name(
    api, owner, team, pool
):
    client = api(owner)
    resp = client.post(URL, spec(hyperparameters={"model": "nano-moe", "moe_top_k": 1,
                                                  "moe_capacity_factor": 1.5}), format="json")
    assert resp.status_code == 201, resp.content
    resp = client.post(URL, spec(name="moe-bad", hyperparameters={
        "model": "nano-moe", "moe_top_k": 9}), format="json")
    assert resp.status_code == 400, resp.content
    assert "moe_top_k=9 must be within [1, moe_experts=8]" in resp.data["hyperparameters"][0]


def test_it_refuses_a_body_that_is_not_an_object(api, owner, cluster):
    resp = api(owner).post(URL, [spec()], format="json")
    assert resp.status_code == 400
    resp = api(owner).post(URL, "{not json", content_type="application/json")
    assert resp.status_code == 400
    assert not TrainingJob.objects.exists()


def test_an_oversize_body_gets_413_and_writes_nothing(api, owner, cluster):
    body = json.dumps(spec(hyperparameters={"model": "nano", "padding": "x" * 1_100_000}))
    resp = api(owner).post(URL, body, content_type="application/json")
    assert resp.status_code == 413
    assert not TrainingJob.objects.exists()


def test_an_oversize_form_encoded_body_gets_413_and_writes_nothing(api, owner, cluster):
    from urllib.parse import urlencode

    body = urlencode({**spec(hyperparameters=...), "padding": "x" * 1_100_000})
    resp = api(owner).post(URL, body, content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 413, resp.content[:300]
    assert "at most 1048576 bytes" in resp.json()["detail"]
    assert not TrainingJob.objects.exists()
    assert not JobEvent.objects.exists()


def test_an_oversize_multipart_body_gets_413_and_writes_nothing(api, owner, cluster):
    from django.core.files.uploadedfile import SimpleUploadedFile

    # Django leaves uploaded files out of its own body limit; ours counts them.
    upload = SimpleUploadedFile("spec.bin", b"x" * 1_100_000)
    resp = api(owner).post(URL, {**spec(hyperparameters=...), "spec": upload},
                           format="multipart")
    assert resp.status_code == 413, resp.content[:300]
    assert not TrainingJob.objects.exists()
    assert not JobEvent.objects.exists()


def test_an_oversize_body_of_any_content_type_gets_413(api, owner, cluster):
    resp = api(owner).post(URL, "x" * 1_100_000, content_type="text/plain")
    assert resp.status_code == 413
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("fmt", ["multipart", "form"])
def test_a_body_that_is_not_json_gets_415_and_writes_nothing(api, owner, cluster, fmt):
    client = api(owner)
    if fmt == "multipart":
        resp = client.post(URL, spec(hyperparameters=...), format="multipart")
    else:
        resp = client.post(URL, "name=gpt&cluster=cpu-a&num_nodes=1&gpus_per_node=2",
                           content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 415, resp.content[:300]
    assert not TrainingJob.objects.exists()
    assert not JobEvent.objects.exists()


def test_one_reply_names_unknown_and_invalid_fields_together(api, owner, cluster):
    resp = api(owner).post(URL, spec(colour="blue", num_nodes="two"), format="json")
    assert resp.status_code == 400
    assert set(resp.data) == {"colour", "num_nodes"}
