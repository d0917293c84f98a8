"""The job and node transition methods behind the API: legal moves write an
event; illegal ones raise and write nothing (the API answers 409)."""

import pytest

from clusters.models import Node, NodeEvent
from controlplane.lib.errors import IllegalTransition
from jobs.models import JobAttempt, JobEvent, Phase, TrainingJob
from tests.api_factories import make_attempt

LEGAL = [(source, target) for target, sources in TrainingJob.TRANSITIONS.items()
         for source in sorted(sources)]
ILLEGAL = [(source, target) for target, sources in TrainingJob.TRANSITIONS.items()
           for source in Phase.values if source not in sources and source != target]


@pytest.mark.parametrize(("source", "target"), LEGAL)
def test_a_legal_job_transition_moves_and_writes_its_event(job, source, target):
    TrainingJob.objects.filter(pk=job.pk).update(phase=source)
    job.refresh_from_db()
    event = job.transition(target, reason="Because", actor="test")
    job.refresh_from_db()
    assert job.phase == target
    assert (event.from_phase, event.to_phase, event.kind) == (source, target, "Because")


@pytest.mark.parametrize(("source", "target"), ILLEGAL)
def test_an_illegal_job_transition_raises_and_writes_nothing(job, source, target):
    TrainingJob.objects.filter(pk=job.pk).update(phase=source)
    job.refresh_from_db()
    with pytest.raises(IllegalTransition):
        job.transition(target, reason="Because")
    job.refresh_from_db()
    assert job.phase == source
    assert not JobEvent.objects.exists()


def test_a_transition_from_a_stale_copy_is_refused(job):
    stale = TrainingJob.objects.get(pk=job.pk)
    job.transition(Phase.CANCELLED, reason="Cancelled")
    with pytest.raises(IllegalTransition):
        stale.transition(Phase.QUEUED, reason="Queued")
    assert TrainingJob.objects.get(pk=job.pk).phase == "cancelled"


def test_a_checkpoint_request_needs_a_running_attempt(job):
    attempt, _ = make_attempt(job, state=JobAttempt.State.STARTING)
    with pytest.raises(IllegalTransition):
        attempt.request_checkpoint("user:x")
    assert not JobEvent.objects.exists()


def test_a_restart_request_is_refused_once_a_cancel_is_asked(job):
    job.request_cancel("user:x")
    with pytest.raises(IllegalTransition):
        job.request_restart(10, "user:x")


@pytest.mark.parametrize(("source", "method"), [("terminated", "uncordon"),
                                                ("replaced", "drain"),
                                                ("provisioning", "drain")])
def test_an_illegal_node_transition_raises_and_writes_nothing(cluster, source, method):
    node = Node.objects.get(name="cpu-a-0")
    Node.objects.filter(pk=node.pk).update(state=source)
    node.refresh_from_db()
    with pytest.raises(IllegalTransition):
        getattr(node, method)(reason="test") if method != "uncordon" else node.uncordon()
    assert Node.objects.get(pk=node.pk).state == source
    assert not NodeEvent.objects.exists()
