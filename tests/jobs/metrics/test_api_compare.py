"""GET /api/v1/jobs/compare/: several jobs' curves overlaid by step or wall
time, hyperparameters side by side with a diff; scoped like every job
endpoint, bounded, and a fixed number of queries per job however long the
series."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.metrics import ingest
from jobs.metrics.compare import MAX_JOBS
from tests.api_factories import make_attempt, make_job
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000.0


def report(job, steps, value=lambda s: 4.0 / (1 + s / 50), name="loss", seconds_per_step=2.0,
           attempt=None):
    """Points through ingest (names table and rollups), a step every
    `seconds_per_step` seconds from T0."""
    attempt = attempt or make_attempt(job)[0]
    rows = [(0, name, s, value(s), T0 + s * seconds_per_step) for s in steps]
    ingest.store(job.pk, attempt.pk, rows, received=len(rows))
    return attempt


@pytest.fixture
def two(team, cluster, owner):
    a = make_job(team, cluster, owner, name="lr-3e-4",
                 hyperparameters={"lr": 3e-4, "model": "nano", "opt": {"beta1": 0.9}})
    b = make_job(team, cluster, owner, name="lr-1e-3",
                 hyperparameters={"lr": 1e-3, "model": "nano", "opt": {"beta1": 0.95},
                                  "warmup": 10})
    report(a, range(1, 101))
    report(b, range(1, 51), value=lambda s: 3.0, seconds_per_step=4.0)
    report(b, range(10, 51, 10), name="val_loss", attempt=b.attempts.get())
    return a, b


def get(user, query):
    return client_for(user).get(f"/api/v1/jobs/compare/?{query}")


def test_it_overlays_two_jobs_by_step_with_their_last_values(owner, two):
    a, b = two
    resp = get(owner, f"jobs={a.pk},{b.pk}&metric=loss")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["metric"] == "loss" and body["x"] == "step"
    assert body["metrics"] == ["loss", "val_loss"]
    assert [j["name"] for j in body["jobs"]] == ["lr-3e-4", "lr-1e-3"]
    first, second = body["jobs"]
    assert first["x"] == list(range(1, 101)) and first["total"] == 100
    assert first["last"] == {"step": 100, "value": pytest.approx(4.0 / 3)}
    assert second["last"] == {"step": 50, "value": 3.0}


def test_it_overlays_by_wall_time_since_each_run_s_first_point(owner, two):
    a, b = two
    body = get(owner, f"jobs={a.pk}&jobs={b.pk}&x=time").json()
    first, second = body["jobs"]
    assert first["x"][:3] == [0.0, 2.0, 4.0] and first["x"][-1] == pytest.approx(198.0)
    assert second["x"][-1] == pytest.approx(196.0)  # 49 steps of 4 s
    assert first["steps"][:3] == [1, 2, 3]


def test_wall_time_of_a_long_series_comes_from_its_rollups(owner, team, cluster):
    job = make_job(team, cluster, owner)
    report(job, range(0, 30_000), seconds_per_step=1.0)
    body = get(owner, f"jobs={job.pk}&x=time&points=200").json()
    curve = body["jobs"][0]
    assert len(curve["x"]) == 200 and curve["total"] == 30_000
    # Each downsampled step lies at its own second (interpolated where the
    # step is a bucket's middle), so the time axis is the step axis shifted.
    for x, step in zip(curve["x"], curve["steps"], strict=True):
        assert x == pytest.approx(step, abs=1.0)


def test_the_hyperparameters_and_spec_are_side_by_side_with_the_differences_marked(owner, two):
    a, b = two
    rows = {r["key"]: r for r in get(owner, f"jobs={a.pk},{b.pk}").json()["params"]}
    assert rows["hyperparameters.lr"] == {"key": "hyperparameters.lr", "values": [3e-4, 1e-3],
                                          "differs": True}
    assert rows["hyperparameters.opt.beta1"]["differs"] is True
    assert rows["hyperparameters.model"]["differs"] is False
    assert rows["hyperparameters.warmup"] == {"key": "hyperparameters.warmup",
                                              "values": [None, 10], "differs": True}
    assert rows["spec.world_size"]["values"] == [a.world_size, b.world_size]
    assert rows["spec.cluster"]["differs"] is False


def test_the_metric_defaults_to_loss_and_an_unreported_one_gives_empty_curves(owner, two):
    a, b = two
    assert get(owner, f"jobs={a.pk},{b.pk}").json()["metric"] == "loss"
    body = get(owner, f"jobs={a.pk},{b.pk}&metric=val_loss").json()
    assert body["jobs"][0]["x"] == [] and body["jobs"][0]["last"] is None
    assert body["jobs"][1]["steps"] == [10, 20, 30, 40, 50]


def test_another_team_s_job_is_not_found_for_a_member(owner, outsider, two, other_team,
                                                      cluster):
    a, _ = two
    theirs = make_job(other_team, cluster, outsider)
    resp = get(owner, f"jobs={a.pk},{theirs.pk}")
    assert resp.status_code == 404
    assert str(theirs.pk) in resp.json()["detail"]
    assert get(outsider, f"jobs={a.pk}").status_code == 404
    assert get(owner, "jobs=999999").status_code == 404


def test_an_operator_compares_jobs_of_any_team(operator, outsider, two, other_team, cluster):
    a, _ = two
    theirs = make_job(other_team, cluster, outsider, name="theirs")
    resp = get(operator, f"jobs={a.pk},{theirs.pk}")
    assert resp.status_code == 200
    assert [j["team"] for j in resp.json()["jobs"]] == ["vision", "speech"]


def test_anonymous_callers_are_refused(two):
    a, _ = two
    assert client_for(None).get(f"/api/v1/jobs/compare/?jobs={a.pk}").status_code == 401


@pytest.mark.parametrize(("query", "field"), [
    ("", "jobs"), ("jobs=", "jobs"), ("jobs=a,b", "jobs"), ("jobs=-3", "jobs"),
    ("jobs=9999999999999999999", "jobs"), ("jobs=0", "jobs"), ("jobs=1,,2", "jobs"),
    ("jobs=%C2%B2", "jobs"), ("jobs={a}&x=epoch", "x"), ("jobs={a}&points=1", "points"),
    ("jobs={a}&points=99999", "points"), ("jobs={a}&metric=" + "m" * 65, "metric"),
])
def test_bad_input_is_400_naming_the_field(owner, two, query, field):
    resp = get(owner, query.format(a=two[0].pk))
    assert resp.status_code == 400, resp.content
    assert field in resp.json()


def test_an_id_of_the_right_shape_that_names_no_job_is_a_404(owner, two):
    assert get(owner, "jobs=99999999999").status_code == 404


def test_more_than_the_cap_of_jobs_is_400(owner, two):
    ids = ",".join(str(i) for i in range(1, MAX_JOBS + 2))
    resp = get(owner, f"jobs={ids}")
    assert resp.status_code == 400
    assert f"At most {MAX_JOBS}" in resp.json()["jobs"][0]
    # The same job named twice counts once.
    assert get(owner, f"jobs={two[0].pk},{two[0].pk}").json()["jobs"][0]["id"] == two[0].pk


def _queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(url)
    assert resp.status_code == 200, resp.content
    return len(ctx.captured_queries)


@pytest.mark.parametrize("x", ["step", "time"])
def test_queries_grow_with_the_jobs_compared_never_with_their_points(owner, team, cluster, x):
    """Pinned like tests/test_list_query_counts.py: a fixed cost per job,
    whether a job has a hundred points or thirty thousand (read from rollups)."""
    client = client_for(owner)
    assert client.get("/api/v1/me/").status_code == 200  # the token's first use
    short = [make_job(team, cluster, owner, name=f"s{i}") for i in range(4)]
    long = [make_job(team, cluster, owner, name=f"l{i}") for i in range(2)]
    for job in short:
        report(job, range(0, 100))
    for job in long:
        report(job, range(0, 30_000))

    def cost(jobs):
        return _queries(client, f"/api/v1/jobs/compare/?x={x}&jobs="
                                + ",".join(str(j.pk) for j in jobs))

    two_short, two_long, four_short = cost(short[:2]), cost(long), cost(short)
    per_job = (four_short - two_short) / 2
    # One of them per metric reads the job's eval runs' points (jobs/evals/).
    assert per_job <= (13 if x == "time" else 8), per_job
    # A long series is read from its rollups in fewer queries than a short
    # one's raw points: its length never adds any.
    assert two_long <= two_short, (two_short, two_long)
