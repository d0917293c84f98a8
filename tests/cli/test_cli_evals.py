"""`regatta evals` against a live server over real HTTP: a job's eval runs
by checkpoint step, with what they reported, for the job's team only."""

import json

import pytest

from jobs.models import Phase, TrainingJob
from tests.frontend.factories import make_job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(120)]


def test_evals_lists_the_runs_by_step_with_their_metrics_and_samples(
        logged_in, owner, outsider, team, cluster):
    parent = make_job(team, cluster, name="train", eval_policy={
        "every_n_checkpoints": 2, "pool": "default", "nodes": 1, "gpus_per_node": 1})
    for step, phase, result in ((100, Phase.QUEUED, {}), (50, Phase.SUCCEEDED, {
            "metrics": {"val_loss": 1.25, "val_perplexity": 3.49},
            "samples": [{"prompt": "ROMEO:", "completion": " soft"}]})):
        make_job(team, cluster, name=f"eval@{step}", kind=TrainingJob.Kind.EVAL, parent=parent,
                 eval_step=step, num_nodes=1, gpus_per_node=1, phase=phase, eval_result=result)
    regatta = logged_in(owner)

    table = regatta("evals", parent.pk, "--samples")
    as_json = json.loads(regatta("evals", parent.pk, "--json").output)
    shown = regatta("show", parent.pk)

    assert table.exit_code == 0, table.stderr
    lines = table.output.splitlines()
    assert lines[0].split()[:5] == ["STEP", "RUN", "PHASE", "VAL_LOSS", "PERPLEXITY"]
    assert lines[1].split()[:5][::2] == ["50", "succeeded", "3.49"]
    assert lines[2].split()[0] == "100" and "queued" in lines[2]
    assert "step 50: 'ROMEO:' -> ' soft'" in table.output
    assert [e["eval_step"] for e in as_json] == [50, 100]
    assert "every 2 checkpoints on pool default" in shown.output
    denied = logged_in(outsider)("evals", parent.pk)
    assert denied.exit_code == 1 and "HTTP 404" in denied.stderr
