"""The framework callback examples (examples/hf_trainer.py with the Hugging
Face RegattaCallback, examples/lightning_train.py with the Lightning one) as
2-node jobs on the local fleet's real torchrun ranks: live metrics, a node
killed mid-run, resumed from the newest verified checkpoint, succeeded, the
final checkpoint kept in the registry."""

import importlib.util

import pytest

from checkpoints.models import ModelArtifact
from jobs.metrics.models import MetricPoint
from jobs.models import Phase

from .test_failures_e2e import refreshed, running
from .test_programs_e2e import kill_a_node, submit_program

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

if not all(importlib.util.find_spec(m) for m in ("transformers", "accelerate", "lightning")):
    # The test extra pins them (`make install`): missing is a broken set-up,
    # not a reason to pass quietly.
    pytest.fail("transformers, accelerate and lightning are missing: run `make install`",
                pytrace=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["hf_trainer.py", "lightning_train.py"])
def test_a_framework_job_survives_a_node_kill_through_its_callback(fleet, script):
    # The fleet's standbys import the frameworks ahead (docs/fleet.md): the
    # ranks of both attempts are forked with them imported.
    cluster = fleet.cluster(standby_imports=["transformers.trainer", "lightning"])
    job = submit_program(fleet, cluster, script, steps=120, sleep=0.1)

    first = fleet.wait("attempt 1 past step 25", running(job, 1, 25), job=job, timeout=150)
    assert MetricPoint.objects.filter(job=job, name="loss").exists()  # live curves
    fleet.wait("a committed checkpoint", lambda: job.checkpoints.filter(
        state__in=("committed", "verified")).exists(), job=job)
    kill_a_node(fleet, cluster, first)

    second = fleet.wait("attempt 2 running", running(job, 2), job=job, timeout=150)
    assert [n["warm"] for n in first.provider_ref["nodes"]] == [True, True]
    assert [n["warm"] for n in second.provider_ref["nodes"]] == [True, True]
    assert second.resume_step is not None and second.resume_step % 20 == 0
    fleet.wait("the job succeeded", lambda: refreshed(job).phase == Phase.SUCCEEDED, job=job,
               timeout=200)
    assert refreshed(job).current_step == 120
    artifact = ModelArtifact.objects.get(job=job)
    assert artifact.checkpoint.step == 120
