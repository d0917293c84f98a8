"""A job's events, attempts, checkpoints, metric series and goodput."""

from datetime import UTC, datetime

import pytest

from clusters.models import Node
from jobs.goodput.models import GoodputEntry
from jobs.metrics import ingest
from jobs.models import AttemptNode, JobAttempt, RankStatus
from tests.api_factories import make_attempt, make_checkpoint, make_job


def test_events_are_the_timeline_oldest_first(api, owner, job):
    job.record("Submitted", actor="user:olivia")
    job.record("Queued", message="needs 2 GPUs")
    data = api(owner).get(f"/api/v1/jobs/{job.pk}/events/").data
    assert [e["kind"] for e in data["results"]] == ["Submitted", "Queued"]
    assert data["results"][1]["message"] == "needs 2 GPUs"


def test_attempts_show_nodes_ranks_exit_and_resume(api, owner, job):
    attempt, _ = make_attempt(job, state=JobAttempt.State.FAILED)
    checkpoint = make_checkpoint(job, 40, attempt=attempt)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        exit_code=-9, failure_class="hardware", resume_step=40, resumed_from=checkpoint,
        preflight={"ok": True, "allreduce_gbps": 1.5},
    )
    node = Node.objects.get(name="cpu-a-0")
    AttemptNode.objects.create(attempt=attempt, node=node, node_rank=0)
    RankStatus.objects.create(attempt=attempt, rank=0, node_name="cpu-a-0", step=41,
                              last_heartbeat_at=datetime.now(UTC))
    [data] = api(owner).get(f"/api/v1/jobs/{job.pk}/attempts/").data["results"]
    assert (data["exit_code"], data["failure_class"], data["resumed_from_step"]) == (
        -9, "hardware", 40)
    assert data["resumed_from_checkpoint"] == checkpoint.pk
    assert data["preflight"]["allreduce_gbps"] == 1.5
    assert data["nodes"] == [{"node_id": node.pk, "node": "cpu-a-0", "node_rank": 0,
                              "node_state": "ready"}]
    assert data["ranks"][0]["step"] == 41


def test_checkpoints_are_listed_newest_first(api, owner, job):
    for step in (100, 300, 200):
        make_checkpoint(job, step)
    data = api(owner).get(f"/api/v1/jobs/{job.pk}/checkpoints/").data["results"]
    assert [c["step"] for c in data] == [300, 200, 100]
    assert data[0]["loadable"] is True


def points(job, attempt, rank, name, steps, value):
    # Through the ingest path, as the worker endpoint stores them: it keeps
    # the names table and the rollups the series and names endpoints read.
    rows = [(rank, name, s, value(s), None) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))


def test_a_metric_series_is_downsampled_to_the_asked_points(api, owner, job):
    attempt, _ = make_attempt(job)
    points(job, attempt, 0, "loss", range(1, 1001), lambda s: 1000.0 / s)
    points(job, attempt, 0, "lr", range(1, 11), lambda s: 0.1)
    data = api(owner).get(f"/api/v1/jobs/{job.pk}/metrics/?name=loss&points=50").data
    assert (data["name"], data["total"], len(data["points"])) == ("loss", 1000, 50)
    assert data["points"][0] == [1, 1000.0] and data["points"][-1] == [1000, 1.0]
    full = api(owner).get(f"/api/v1/jobs/{job.pk}/metrics/?name=loss").data
    assert len(full["points"]) == 600


def test_the_newest_attempt_and_rank_0_win_a_replayed_step(api, owner, job):
    first, _ = make_attempt(job, state=JobAttempt.State.FAILED)
    second, _ = make_attempt(job)
    points(job, first, 0, "loss", range(1, 11), lambda s: 1.0)
    points(job, second, 1, "loss", range(5, 11), lambda s: 3.0)
    points(job, second, 0, "loss", range(5, 11), lambda s: 2.0)
    data = api(owner).get(f"/api/v1/jobs/{job.pk}/metrics/?name=loss").data
    assert data["points"] == [[s, 1.0] for s in range(1, 5)] + [[s, 2.0] for s in range(5, 11)]


def test_metric_names_and_bad_queries(api, owner, job):
    attempt, _ = make_attempt(job)
    points(job, attempt, 0, "loss", [1], lambda s: 1.0)
    points(job, attempt, 0, "grad_norm", [1], lambda s: 1.0)
    client = api(owner)
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics/names/").data == {
        "names": ["grad_norm", "loss"]}
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics/").status_code == 400
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics/?name=loss&points=5001").status_code == 400
    assert client.get(f"/api/v1/jobs/{job.pk}/metrics/?name=nope").data == {
        "name": "nope", "total": 0, "points": []}


def test_goodput_is_summed_per_category_for_the_job_and_the_team(api, owner, job, team, cluster):
    other = make_job(team, cluster, owner, name="second")
    rows = [(job, "productive", 100, 400), (job, "productive", 50, 200),
            (job, "rollback", 10, 40), (other, "queued", 30, 0)]
    for i, (j, category, seconds, gpu_seconds) in enumerate(rows):
        GoodputEntry.objects.create(job=j, category=category, seconds=seconds,
                                    gpu_seconds=gpu_seconds, key=f"k{i}")
    data = api(owner).get(f"/api/v1/jobs/{job.pk}/goodput/").data
    assert data["categories"]["productive"] == {"seconds": 150.0, "gpu_seconds": 600.0}
    assert data["categories"]["rollback"] == {"seconds": 10.0, "gpu_seconds": 40.0}
    assert data["categories"]["hang"] == {"seconds": 0.0, "gpu_seconds": 0.0}
    assert data["total"] == {"seconds": 160.0, "gpu_seconds": 640.0}
    assert data["goodput_ratio"] == pytest.approx(600 / 640)
    team_data = api(owner).get("/api/v1/teams/vision/goodput/").data
    assert team_data["total"] == {"seconds": 190.0, "gpu_seconds": 640.0}
    assert team_data["categories"]["queued"]["seconds"] == 30.0


def test_another_teams_goodput_is_not_found(api, outsider, team):
    assert api(outsider).get("/api/v1/teams/vision/goodput/").status_code == 404
