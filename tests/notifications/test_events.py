"""Which timeline events reach which webhooks, driven by the real job
reconciler on the in-memory fleet (tests/support/memory_provider.py, the
suite's stand-in for a cluster)."""

import json

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.admission import admit
from jobs.models import JobEvent, Phase
from jobs.reconcile import reconcile_job_unlocked
from notifications.events import SUBSCRIBABLE, types_for
from notifications.models import Delivery, Webhook
from tests.fleet_helpers import (
    heartbeat,
    later,
    memory_cluster,
    nodes_of,
    provider_of,
    report_not_ready,
    running_job,
    submit,
    team_with_quota,
)

pytestmark = pytest.mark.usefixtures("fleet_dirs")


@pytest.fixture
def mem_cluster(db):
    return memory_cluster(heartbeat_deadline_s=10.0)


@pytest.fixture
def vision(mem_cluster):
    return team_with_quota(mem_cluster)


@pytest.fixture
def speech(mem_cluster):
    return team_with_quota(mem_cluster, name="speech")


def hook(team, url="https://hooks.example.com/x", events=SUBSCRIBABLE, **kw):
    return Webhook.objects.create(team=team, url=url, events=list(events), **kw)



def code_error(cluster, attempt):
    provider_of(cluster).exit_node(
        attempt.provider_ref, nodes_of(attempt)[0].name, exit_code=1,
        ranks=({"rank": 0, "exit_code": 1, "failure_class": "code",
                "error": "ValueError: fail_at_step=3"},))


def sent(webhook) -> list[str]:
    return list(Delivery.objects.filter(webhook=webhook).order_by("id")
                .values_list("event_type", flat=True))


def test_a_job_that_succeeds_is_sent_once_to_each_subscribed_webhook_of_its_team(
        mem_cluster, vision, speech):
    mine = [hook(vision), hook(vision, events=["job.succeeded"])]
    not_subscribed = hook(vision, events=["job.failed"])
    inactive = hook(vision, active=False)
    theirs = hook(speech)
    now = timezone.now()
    job, attempt = running_job(mem_cluster, vision, now, completion="exit")
    provider_of(mem_cluster).finish(attempt.provider_ref)
    reconcile_job_unlocked(job.id, later(now, 5))
    reconcile_job_unlocked(job.id, later(now, 6))  # a second pass sends nothing more
    job.refresh_from_db()
    assert job.phase == Phase.SUCCEEDED
    assert [sent(h) for h in mine] == [["job.succeeded"], ["job.succeeded"]]
    assert sent(not_subscribed) == sent(inactive) == sent(theirs) == []
    payload = Delivery.objects.filter(webhook=mine[0]).get().payload
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["team"] == "vision"
    assert payload["data"]["job"] == {
        "id": job.pk, "name": "train", "phase": "succeeded", "cluster": "mem-a",
        "url": f"http://127.0.0.1:8000/jobs/{job.pk}/"}
    assert payload["data"]["event"]["kind"] == "Succeeded"
    assert payload["data"]["event"]["attempt"] == 1


def test_a_job_that_fails_is_sent_once_and_a_spent_budget_only_if_it_had_restarts(
        mem_cluster, vision, speech):
    failed, budget = hook(vision, events=["job.failed"]), hook(vision,
                                                                events=["job.budget_spent"])
    theirs = hook(speech)
    now = timezone.now()
    job, attempt = running_job(mem_cluster, vision, now)  # the code budget is 0
    code_error(mem_cluster, attempt)
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert sent(failed) == ["job.failed"] and sent(budget) == [] and sent(theirs) == []
    event = Delivery.objects.get(webhook=failed).payload["data"]["event"]
    assert "fail_at_step=3" in event["message"] and event["evidence"]["class"] == "code"


def test_a_failure_that_spends_a_restart_budget_is_sent_as_budget_spent(mem_cluster, vision):
    everything = hook(vision)
    now = timezone.now()
    job, attempt = running_job(mem_cluster, vision, now, restart_budgets={"code": 1})
    code_error(mem_cluster, attempt)
    reconcile_job_unlocked(job.id, later(now, 2))
    job.refresh_from_db()
    # Restarted at once (no backoff for a code error): nothing to tell yet.
    assert job.phase == Phase.STARTING and sent(everything) == []
    second = job.attempts.order_by("-number").first()
    assert second.number == 2
    heartbeat(second, 6, later(now, 4))
    reconcile_job_unlocked(job.id, later(now, 4))
    code_error(mem_cluster, second)
    reconcile_job_unlocked(job.id, later(now, 5))
    job.refresh_from_db()
    assert job.phase == Phase.FAILED
    assert sent(everything) == ["job.failed", "job.budget_spent"]


def test_a_killed_node_is_sent_as_node_replaced(mem_cluster, vision):
    nodes = hook(vision, events=["node.replaced"])
    now = timezone.now()
    job, attempt = running_job(mem_cluster, vision, now)
    bad = nodes_of(attempt)[0]
    provider_of(mem_cluster).exit_node(attempt.provider_ref, bad.name, exit_code=1, signal=9,
                                       log_tail="Killed")
    # The node went with its ranks: without that, one rank's death is
    # relaunched in place (jobs/recovery/evidence.py) and nothing replaced.
    report_not_ready(mem_cluster, bad)
    reconcile_job_unlocked(job.id, later(now, 2))
    assert sent(nodes) == ["node.replaced"]
    evidence = Delivery.objects.get(webhook=nodes).payload["data"]["event"]["evidence"]
    assert evidence["old"] == bad.name and evidence["new"]


def test_ranks_stopped_by_a_spot_notice_or_drain_are_sent_as_preempted(mem_cluster, vision):
    preempted = hook(vision, events=["job.preempted"], format=Webhook.Format.SLACK)
    now = timezone.now()
    job, attempt = running_job(mem_cluster, vision, now)
    for i, node in enumerate(nodes_of(attempt)):
        provider_of(mem_cluster).exit_node(
            attempt.provider_ref, node.name, exit_code=83,
            ranks=({"rank": 2 * i, "exit_code": 83}, {"rank": 2 * i + 1, "exit_code": 83}))
    reconcile_job_unlocked(job.id, later(now, 2))
    assert sent(preempted) == ["job.preempted"]
    text = Delivery.objects.get(webhook=preempted).payload["text"]
    assert text.startswith(f"[vision] Job <http://127.0.0.1:8000/jobs/{job.pk}/|train #{job.pk}>"
                           " was preempted: preempted:")


def test_a_gang_evicted_for_a_job_of_higher_priority_is_sent_as_preempted_once(db):
    cluster = memory_cluster(name="mem-b", size=4, spares=0, preemption_checkpoint_wait_s=5.0)
    team = team_with_quota(cluster, name="vision", gpus=8)
    preempted = hook(team, events=["job.preempted", "job.failed", "job.succeeded"])
    now = timezone.now()
    low, _ = running_job(cluster, team, now, name="low", nodes=4)
    high = submit(cluster, team, name="high", nodes=2, priority=5)
    high.transition(Phase.QUEUED, reason="Queued", now=later(now, 5))
    admit(cluster.id, later(now, 6))  # asks the victim to checkpoint: nothing to tell
    reconcile_job_unlocked(low.id, later(now, 9))
    assert sent(preempted) == []
    reconcile_job_unlocked(low.id, later(now, 12))  # no checkpoint in time: stopped, requeued
    low.refresh_from_db()
    assert low.phase == Phase.QUEUED
    assert sent(preempted) == ["job.preempted"]
    event = Delivery.objects.get(webhook=preempted).payload["data"]["event"]
    assert event["kind"] == "Preempted" and event["evidence"]["by"] == high.pk


def test_admission_and_a_hardware_restart_are_not_preempted():
    admitted = JobEvent(kind="Admitted", from_phase="queued", to_phase="admitted")
    restarting = JobEvent(kind="Restarting", from_phase="running", to_phase="restarting",
                          evidence={"class": "hardware"})
    assert types_for(admitted) == types_for(restarting) == []


def test_a_transition_that_rolls_back_notifies_nobody(mem_cluster, vision):
    everything = hook(vision)
    job = submit(mem_cluster, vision)
    with pytest.raises(RuntimeError), transaction.atomic():
        job.transition(Phase.FAILED, reason="Failed", now=timezone.now())
        assert sent(everything) == ["job.failed"]
        raise RuntimeError("the reconcile pass died")
    assert sent(everything) == []


def test_a_fault_in_notifications_never_fails_the_transition(mem_cluster, vision, monkeypatch):
    hook(vision)
    job = submit(mem_cluster, vision)

    def broken(*args):
        raise ValueError("a bug in a payload")

    monkeypatch.setattr("notifications.payloads.event_document", broken)
    job.transition(Phase.FAILED, reason="Failed", now=timezone.now())
    job.refresh_from_db()
    assert job.phase == Phase.FAILED and not Delivery.objects.exists()


def test_slack_text_escapes_what_slack_would_read_as_markup(mem_cluster, vision):
    slack = hook(vision, format=Webhook.Format.SLACK)
    job = submit(mem_cluster, vision, name="a<b>&c")
    job.transition(Phase.FAILED, reason="Failed", message="<!channel> boom",
                   now=timezone.now())
    text = Delivery.objects.get(webhook=slack).payload["text"]
    assert "a&lt;b&gt;&amp;c" in text and text.endswith("failed: &lt;!channel&gt; boom")
    assert json.loads(json.dumps({"text": text})) == {"text": text}
