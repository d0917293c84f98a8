"""GET /api/v1/jobs/<id>/metrics/tensorboard/: the job's metrics as a
TensorBoard event file, read back with TensorBoard's own reader."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jobs.metrics import ingest
from jobs.models import JobAttempt
from tests.api_factories import make_attempt, make_job
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000.0


def store(job, attempt, name, steps, value, rank=0):
    rows = [(rank, name, s, value(s), T0 + s) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))


def export(user, job, folder):
    resp = client_for(user).get(f"/api/v1/jobs/{job.pk}/metrics/tensorboard/")
    assert resp.status_code == 200
    assert resp.streaming  # made as it is sent, never whole in memory
    name = resp["Content-Disposition"].split('filename="')[1].rstrip('"')
    assert name.startswith("events.out.tfevents.") and name.endswith(f"regatta-job-{job.pk}")
    (folder / name).write_bytes(b"".join(resp.streaming_content))
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return events


def test_the_event_file_loads_in_tensorboard_with_every_point(owner, team, cluster, tmp_path):
    job = make_job(team, cluster, owner)
    first, _ = make_attempt(job, state=JobAttempt.State.FAILED, number=1)
    store(job, first, "loss", range(1, 121), lambda s: 5.0 - s / 100)
    store(job, first, "tokens_per_s", range(1, 121), lambda s: 1000.0 + s)
    # The second attempt resumed from step 100: its steps 101.. replace the first's.
    second, _ = make_attempt(job, number=2)
    JobAttempt.objects.filter(pk=second.pk).update(resume_step=100)
    store(job, second, "loss", range(101, 301), lambda s: -1.0)
    store(job, second, "val_loss", range(50, 301, 50), lambda s: 2.5)
    # Another rank's copy of loss is not the job's loss.
    store(job, second, "loss", range(101, 301), lambda s: 99.0, rank=1)

    events = export(owner, job, tmp_path)

    assert sorted(events.Tags()["scalars"]) == ["loss", "tokens_per_s", "val_loss"]
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == list(range(1, 301))
    assert [e.value for e in loss[:100]] == pytest.approx([5.0 - s / 100 for s in range(1, 101)])
    assert {e.value for e in loss[100:]} == {-1.0}
    assert [e.wall_time for e in loss[:3]] == [T0 + 1, T0 + 2, T0 + 3]
    assert [e.step for e in events.Scalars("val_loss")] == [50, 100, 150, 200, 250, 300]
    # The first attempt's steps past its successor's resume step were
    # replayed: the file holds what the charts hold.
    assert [e.step for e in events.Scalars("tokens_per_s")] == list(range(1, 101))


def test_a_metric_only_other_ranks_reported_gives_one_value_a_step(owner, team, cluster,
                                                                  tmp_path):
    job = make_job(team, cluster, owner)
    attempt, _ = make_attempt(job)
    for rank in (1, 2):
        store(job, attempt, "grad_norm", range(0, 10), lambda s, r=rank: float(r), rank=rank)
    values = export(owner, job, tmp_path).Scalars("grad_norm")
    assert [e.step for e in values] == list(range(10))
    assert {e.value for e in values} == {1.0}  # the lowest rank speaks


def test_a_job_without_metrics_exports_a_valid_empty_file(owner, team, cluster, tmp_path):
    job = make_job(team, cluster, owner)
    assert export(owner, job, tmp_path).Tags()["scalars"] == []


def test_another_team_s_job_is_not_found_and_an_operator_exports_any(
        owner, outsider, operator, team, cluster, tmp_path):
    job = make_job(team, cluster, owner)
    store(job, make_attempt(job)[0], "loss", range(3), float)
    url = f"/api/v1/jobs/{job.pk}/metrics/tensorboard/"
    assert client_for(outsider).get(url).status_code == 404
    assert client_for(None).get(url).status_code == 401
    assert [e.step for e in export(operator, job, tmp_path).Scalars("loss")] == [0, 1, 2]
