"""`regatta compare` and `regatta tensorboard` against a live server over
real HTTP."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jobs.metrics import ingest
from tests.frontend.factories import make_job, run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(120)]

T0 = 1_700_000_000.0


def runs(team, cluster):
    nodes = list(cluster.nodes.filter(is_spare=False).order_by("name"))
    a = make_job(team, cluster, name="small-lr", hyperparameters={"lr": 1e-4, "model": "nano"})
    b = make_job(team, cluster, name="big-lr", hyperparameters={"lr": 1e-3, "model": "nano"})
    for job, pair, final in ((a, nodes[:2], 0.9), (b, nodes[2:4], 0.4)):
        attempt = run(job, pair)
        rows = [(0, "loss", s, 3.0 if s < 99 else final, T0 + s) for s in range(100)]
        ingest.store(job.pk, attempt.pk, rows, received=len(rows))
    return a, b


def test_compare_prints_last_values_and_only_the_differing_keys(logged_in, owner, team,
                                                                cluster):
    a, b = runs(team, cluster)
    regatta = logged_in(owner)
    result = regatta("compare", a.pk, b.pk, "--metric", "loss")
    assert result.exit_code == 0, result.stderr
    lines = result.output.splitlines()
    assert lines[0].split()[:6] == ["ID", "NAME", "TEAM", "PHASE", "LAST", "loss"]
    assert lines[1].split()[:6] == [str(a.pk), "small-lr", "vision", "running", "0.9", "99"]
    assert lines[2].split()[:6] == [str(b.pk), "big-lr", "vision", "running", "0.4", "99"]
    diff = [line.split() for line in lines[4:]]
    assert diff[0] == ["KEY", f"#{a.pk}", f"#{b.pk}"]
    assert diff[1:] == [["hyperparameters.lr", "0.0001", "0.001"]]  # model is the same

    every = regatta("compare", a.pk, b.pk, "--all").output
    assert "hyperparameters.model" in every and "spec.world_size" in every
    as_json = json.loads(regatta("compare", a.pk, b.pk, "--json").output)
    assert [j["id"] for j in as_json["jobs"]] == [a.pk, b.pk]


def test_compare_shows_the_api_s_refusals(logged_in, owner, outsider, team, cluster,
                                          other_team):
    a, _ = runs(team, cluster)
    theirs = make_job(other_team, cluster, name="theirs")
    regatta = logged_in(owner)
    hidden = regatta("compare", a.pk, theirs.pk)
    assert hidden.exit_code == 1 and "HTTP 404" in hidden.stderr
    too_many = regatta("compare", *range(1, 12))
    assert too_many.exit_code == 1 and "At most 10 jobs" in too_many.stderr


def test_tensorboard_writes_a_log_folder_tensorboard_reads(logged_in, owner, team, cluster,
                                                          tmp_path):
    a, _ = runs(team, cluster)
    result = logged_in(owner)("tensorboard", a.pk, "-o", tmp_path / "logs")
    assert result.exit_code == 0, result.stderr
    assert f"tensorboard --logdir {tmp_path / 'logs'}" in result.output
    events = EventAccumulator(str(tmp_path / "logs" / f"job-{a.pk}"))
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == list(range(100))
    assert loss[-1].value == pytest.approx(0.9) and loss[0].wall_time == T0
