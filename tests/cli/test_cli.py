"""The CLI against a live server over real HTTP (in-process via click's runner,
and once as a separate program)."""

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from jobs.models import Phase, TrainingJob
from tests.frontend.factories import checkpoint, make_job, metrics, run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def spec_file(tmp_path, **overrides) -> Path:
    spec = {"name": "cli-job", "team": "vision", "cluster": "cpu-a", "num_nodes": 2,
            "gpus_per_node": 2, "world_size": 4, "strategy": "ddp",
            "hyperparameters": {"model": "nano", "max_steps": 50},
            "checkpoint_every_steps": 10}
    spec.update(overrides)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_login_checks_the_token_and_stores_it_for_its_owner_only(regatta, token, owner):
    raw = token(owner)
    result = regatta("login", "--url", regatta.url, "--token", raw)
    assert result.exit_code == 0, result.output
    assert "as olivia" in result.output and "vision" in result.output
    assert json.loads(regatta.config.read_text()) == {"url": regatta.url, "token": raw}
    assert stat.S_IMODE(regatta.config.stat().st_mode) == 0o600


def test_login_with_a_bad_token_shows_the_401_and_stores_nothing(regatta, owner):
    result = regatta("login", "--url", regatta.url, "--token", "rgt_not-a-real-token")
    assert result.exit_code == 1
    assert "HTTP 401" in result.stderr and "Invalid or revoked token" in result.stderr
    assert not regatta.config.exists()


def test_without_a_login_it_says_how_to_log_in(regatta):
    result = regatta("list")
    assert result.exit_code == 1 and "regatta login" in result.stderr


def test_the_environment_overrides_the_config_file(regatta, token, owner, outsider, team):
    make_job(team, team.quotas.first().cluster, name="vision-job")
    regatta("login", "--url", regatta.url, "--token", token(owner))
    env = {"REGATTA_API_TOKEN": token(outsider)}
    assert "vision-job" not in regatta("list", env=env).output
    assert "vision-job" in regatta("list").output


def test_submit_from_yaml_creates_the_job(logged_in, owner, team, tmp_path):
    regatta = logged_in(owner)
    result = regatta("submit", spec_file(tmp_path))
    assert result.exit_code == 0, result.output
    job = TrainingJob.objects.get(name="cli-job")
    assert result.output.startswith(f"Submitted job {job.pk} cli-job (pending)")
    assert (job.team.name, job.num_nodes, job.gpus_per_node, job.created_by) == (
        "vision", 2, 2, owner)
    assert job.hyperparameters == {"model": "nano", "max_steps": 50}
    assert job.events.filter(kind="Submitted", actor="user:olivia").exists()


def test_a_bad_spec_shows_the_api_s_field_messages_and_writes_nothing(
        logged_in, owner, team, tmp_path):
    regatta = logged_in(owner)
    result = regatta("submit", spec_file(tmp_path, world_size=3, colour="blue"))
    assert result.exit_code == 1
    assert "HTTP 400 Bad Request" in result.stderr
    assert "colour" in result.stderr
    result = regatta("submit", spec_file(tmp_path, world_size=3))
    assert result.exit_code == 1
    assert "world_size:" in result.stderr
    assert not TrainingJob.objects.exists()


def test_a_spec_file_that_is_not_a_mapping_is_refused_before_any_request(
        logged_in, owner, team, tmp_path):
    regatta = logged_in(owner)
    path = tmp_path / "job.yaml"
    path.write_text("- just\n- a list\n")
    result = regatta("submit", path)
    assert result.exit_code == 1 and "must hold a mapping" in result.stderr


def test_the_example_job_spec_is_accepted_by_the_api(logged_in, operator, django_user_model):
    """examples/job.yaml targets the demo world; create it and submit the file."""
    from django.core.management import call_command

    call_command("regatta_demo", "--no-job", stdout=open(os.devnull, "w"))
    regatta = logged_in(operator)
    result = regatta("submit", ROOT / "examples" / "job.yaml")
    assert result.exit_code == 0, result.stderr
    job = TrainingJob.objects.get(name="gpt-tiny-shakespeare")
    assert (job.cluster.name, job.num_nodes, job.world_size) == ("local", 2, 2)


def test_list_shows_the_team_s_jobs_filtered_and_as_json(logged_in, owner, team, other_team,
                                                         cluster):
    running = make_job(team, cluster, name="running-job")
    run(running, list(cluster.nodes.all()[:2]))
    make_job(team, cluster, name="waiting-job", pending_reason="needs 8 GPUs; 4 free")
    make_job(other_team, cluster, name="other-team-job")
    regatta = logged_in(owner)
    out = regatta("list").output
    assert "running-job" in out and "waiting-job" in out and "other-team-job" not in out
    assert "needs 8 GPUs; 4 free" in out
    assert out.splitlines()[0].split() == ["ID", "NAME", "TEAM", "CLUSTER", "PHASE", "STEP",
                                           "GPUS", "AGE", "REASON"]
    filtered = regatta("list", "--phase", "running").output
    assert "running-job" in filtered and "waiting-job" not in filtered
    page = json.loads(regatta("list", "--json").output)
    assert page["next"] is None and "count" not in page  # a big list is never counted unasked
    assert {j["name"] for j in page["results"]} == {"running-job", "waiting-job"}
    assert len(json.loads(regatta("--json", "list").output)["results"]) == 2


def test_show_events_and_checkpoints(logged_in, teammate, team, cluster):
    job = make_job(team, cluster, name="shown")
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    checkpoint(job, attempt, 200, emergency=True)
    regatta = logged_in(teammate)
    out = regatta("show", job.pk).output
    assert "Phase" in out and "running" in out and "world size 4" in out
    events = regatta("events", job.pk).output
    assert "Admitted" in events and "queued->admitted" in events
    lines = regatta("checkpoints", job.pk).output.splitlines()
    assert lines[1].split()[:3] == ["200", "verified", "(emergency)"]
    assert lines[2].split()[:2] == ["100", "verified"]
    data = json.loads(regatta("checkpoints", job.pk, "--json").output)
    assert sorted(c["step"] for c in data) == [100, 200]
    assert {c["step"]: c["emergency"] for c in data} == {100: False, 200: True}


def test_cancel_asks_for_a_cancel_and_a_repeat_is_harmless(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    regatta = logged_in(owner)
    result = regatta("cancel", job.pk)
    assert result.exit_code == 0
    assert "(now cancelled)" in result.output
    job.refresh_from_db()
    assert job.phase == Phase.CANCELLED
    assert job.events.filter(kind="CancelRequested", actor="user:olivia").count() == 1
    assert regatta("cancel", job.pk).exit_code == 0
    assert job.events.filter(kind="CancelRequested").count() == 1


def test_another_team_s_job_is_a_404(logged_in, outsider, team, cluster):
    job = make_job(team, cluster)
    regatta = logged_in(outsider)
    for command in ("show", "cancel", "events"):
        result = regatta(command, job.pk)
        assert result.exit_code == 1 and "HTTP 404" in result.stderr
    job.refresh_from_db()
    assert job.cancel_requested_at is None


def test_nodes_lists_the_fleet(logged_in, owner, cluster):
    cluster.nodes.get(name="cpu-a-1").cordon("bad fan")
    regatta = logged_in(owner)
    out = regatta("nodes").output
    assert "cpu-a-0" in out and "spare" in out and "bad fan" in out
    cordoned = json.loads(regatta("nodes", "--state", "cordoned", "--json").output)
    assert [n["name"] for n in cordoned] == ["cpu-a-1"]


def _finish_later(job_id, phase, delay=1.0):
    def go():
        time.sleep(delay)  # not a wait: the job must end while the CLI watches it
        job = TrainingJob.objects.get(pk=job_id)
        if phase == Phase.SUCCEEDED:
            job.transition(Phase.SUCCEEDED, reason="Finished")
        else:
            job.request_cancel("user:olivia")
            job.refresh_from_db()
            job.transition(Phase.CANCELLED, reason="Cancelled")
    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_watch_follows_the_job_and_exits_0_when_it_succeeds(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    metrics(job, attempt, "loss", range(1, 40), value=lambda s: 3.0 - s / 100)
    TrainingJob.objects.filter(pk=job.pk).update(current_step=39,
                                                 progress={"tokens_per_s": 4321.0})
    regatta = logged_in(owner)
    thread = _finish_later(job.pk, Phase.SUCCEEDED)
    result = regatta("watch", job.pk, "--interval", "0.3")
    thread.join()
    assert result.exit_code == 0, result.output
    assert "39/400" in result.output and "loss 2.6100" in result.output
    assert "4,321 tok/s" in result.output
    assert f"Job {job.pk} gpt-tiny succeeded at step 39." in result.output


def test_watch_exits_non_zero_when_the_job_is_cancelled(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    run(job, list(cluster.nodes.all()[:2]))
    regatta = logged_in(owner)
    thread = _finish_later(job.pk, Phase.CANCELLED, delay=0.5)
    result = regatta("watch", job.pk, "--interval", "0.3", "--json")
    thread.join()
    assert result.exit_code == 3
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["phase"] == "cancelled"


def test_it_runs_as_a_program_with_the_environment_for_config(live_server, token, owner, team,
                                                              cluster, tmp_path):
    make_job(team, cluster, name="from-a-process")
    env = {**os.environ, "REGATTA_API_URL": live_server.url, "REGATTA_API_TOKEN": token(owner),
           "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "cli.main", "list", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [j["name"] for j in json.loads(proc.stdout)["results"]] == ["from-a-process"]


def test_a_restart_that_backs_off_or_waits_for_nodes_shows_why(logged_in, owner, team, cluster):
    backing_off = make_job(team, cluster, name="backs-off")
    run(backing_off, list(cluster.nodes.all()[:2]))
    backing_off.transition(Phase.RESTARTING, reason="Restarting", conditions=[
        {"type": "RestartBackoff", "until": time.time() + 45, "seconds": 45.0}])
    waiting = make_job(team, cluster, name="waits-for-nodes")
    run(waiting, list(cluster.nodes.all()[2:4]))
    waiting.transition(Phase.RESTARTING, reason="Restarting",
                       pending_reason="needs 2 healthy nodes; 1 free in pool default")
    regatta = logged_in(owner)
    out = regatta("list").output
    assert "backing off after a transient failure; retrying in 4" in out
    assert "needs 2 healthy nodes; 1 free in pool default" in out
    shown = regatta("show", backing_off.pk).output
    assert "Waiting" in shown and "backing off after a transient failure" in shown
    assert "every 100 steps (fixed)" in shown


def test_watch_shows_why_a_restarting_job_waits(logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    run(job, list(cluster.nodes.all()[:2]))
    job.transition(Phase.RESTARTING, reason="Restarting",
                   pending_reason="needs 2 healthy nodes; 1 free in pool default")
    regatta = logged_in(owner)
    thread = _finish_later(job.pk, Phase.CANCELLED, delay=0.8)
    result = regatta("watch", job.pk, "--interval", "0.3")
    thread.join()
    assert result.exit_code == 3
    assert "restarting  waiting: needs 2 healthy nodes; 1 free in pool default" in result.output


def test_restart_reruns_an_ended_job_and_show_tells_restarts_spent_of_all(
        logged_in, owner, teammate, team, cluster):
    job = make_job(team, cluster, owner, name="ended")
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    job.transition(Phase.FAILED, reason="Failed", restart_counts={"hardware": 6},
                   budget_spent={"hardware": 1}, restart_marks={"hardware": {
                       "step": job.current_step, "at": time.time()}},
                   last_error="hardware budget spent")
    shown = logged_in(owner)("show", job.pk)
    assert "hardware 1/5 (6 in all)" in shown.output
    refused = logged_in(teammate)("restart", job.pk, "--from-step", 100)
    assert refused.exit_code == 1
    assert "HTTP 403" in refused.stderr and "owner" in refused.stderr
    result = logged_in(owner)("restart", job.pk, "--from-step", 100)
    assert result.exit_code == 0, result.stderr
    assert f"Rerun of job {job.pk} ended from step 100 requested (now queued)" in result.output
    job.refresh_from_db()
    assert (job.phase, job.restart_from_step, job.generation, job.restart_counts) == (
        Phase.QUEUED, 100, 2, {})
    assert job.events.get(kind="Rerun").actor == "user:olivia"
    assert "hardware 0/5" in logged_in(owner)("show", job.pk).output


def test_restart_from_a_chosen_checkpoint_and_the_api_s_refusal_as_it_gave_it(
        logged_in, owner, team, cluster):
    job = make_job(team, cluster)
    attempt = run(job, list(cluster.nodes.all()[:2]))
    checkpoint(job, attempt, 100)
    checkpoint(job, attempt, 200, state="deleted")
    regatta = logged_in(owner)
    result = regatta("restart", job.pk, "--from-step", 100)
    assert result.exit_code == 0, result.stderr
    assert f"Restart of job {job.pk} gpt-tiny from step 100 requested" in result.output
    job.refresh_from_db()
    assert job.restart_from_step == 100
    assert job.events.get(kind="RestartRequested").actor == "user:olivia"
    refused = regatta("restart", job.pk, "--from-step", 200)
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == [
        "Error: HTTP 409 Conflict",
        f"  Job {job.pk} has no committed or verified checkpoint at step 200.",
    ]
    body = json.loads(regatta("restart", job.pk, "--from-step", 200, "--json").stderr)
    assert body == {"status": 409, "error": {
        "detail": f"Job {job.pk} has no committed or verified checkpoint at step 200."}}
    job.refresh_from_db()
    assert job.restart_from_step == 100
