"""The reporter's bounded buffer under concurrency: a training thread that
appends while the reporting thread sends, to a real HTTP server that fails
some requests after reading them (so batches are retried); what passes the
bound in memory waits on disk (tests/worker_image/test_reporter_spool.py)."""

import collections
import threading
import time

import pytest
from regatta.reporting import Reporter

from tests.support.waiting import eventually

pytestmark = [pytest.mark.timeout(60)]


def reporter_for(plane, **kwargs) -> Reporter:
    return Reporter(plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                    heartbeat_interval_s=0.05, job_id="3", **kwargs)


def spy(method, calls: list):
    def wrapper(items):
        calls.append(items[0][0])
        return method(items)
    return wrapper


def drop_reports(plane) -> list[dict]:
    return [r["body"] for r in plane.of_kind("events", accepted_only=True)
            if r["body"]["kind"] == "reports_dropped"]


def test_points_are_sent_once_in_order_and_a_retried_batch_never_changes(control_plane):
    seen = collections.Counter()

    def one_report_in_three_fails(record):
        if record["kind"] == "heartbeat":
            return None
        seen[record["kind"]] += 1
        return 503 if seen[record["kind"]] % 3 == 1 else None

    control_plane.status_for = one_report_in_three_fails
    reporter = reporter_for(control_plane, max_metrics=200, max_events=5)
    spilled = []
    reporter.metrics.spill = spy(reporter.metrics.spill, spilled)
    reporter.urgent.spill = spy(reporter.urgent.spill, spilled)
    reporter.start()
    produced = {"metrics": 0, "events": 0}

    def train(kind: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if kind == "metrics":
                reporter.metric("loss", produced["metrics"], 1.0)
            else:
                reporter.event("tick", "", {"seq": produced["events"]})
            produced[kind] += 1
            # A pace, not a wait. Events are rarer: a few dozen, still past their bound.
            time.sleep(0.0002 if kind == "metrics" else 0.08)

    threads = [threading.Thread(target=train, args=(kind, 2.0)) for kind in produced]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        eventually(lambda: reporter.pending() == 0, timeout=20, what="everything sent")
    finally:
        reporter.close()

    batches = collections.defaultdict(list)
    for r in control_plane.of_kind("metrics"):
        batches[r["body"]["batch_id"]].append(r)
    assert any(len(posts) > 1 for posts in batches.values())  # retries did happen
    for batch_id, posts in batches.items():
        assert batch_id.startswith("j3-a7-r0-")
        assert all(p["body"]["points"] == posts[0]["body"]["points"] for p in posts), batch_id
        assert all(p["body"]["job_id"] == "3" for p in posts)
    sent = [p["step"] for r in control_plane.of_kind("metrics", accepted_only=True)
            for p in r["body"]["points"]]
    # In order, none twice, none lost: what passed the bound went to disk and back.
    assert sent == list(range(produced["metrics"]))
    assert not reporter.dropped and not drop_reports(control_plane)
    assert {"metrics", "events"} <= set(spilled)  # both queues went past their bound

    ticks = [r["body"]["data"]["seq"] for r in control_plane.of_kind("events", accepted_only=True)
             if r["body"]["kind"] == "tick"]
    assert ticks == list(range(produced["events"]))


def test_points_past_twice_the_bound_go_to_disk_from_the_training_thread_when_the_sender_is_held(
        control_plane):
    # Not started: the reporting thread is as held up as one stuck in a post
    # to a control plane going away. The training thread spills itself.
    reporter = reporter_for(control_plane, max_metrics=50)
    for step in range(400):
        reporter.metric("loss", step, 1.0)
    assert not reporter.dropped
    assert len(reporter.metrics.memory) <= 100 and reporter.metrics.spooled > 0

    reporter.start()
    try:
        eventually(lambda: reporter.pending() == 0, timeout=20, what="everything sent")
    finally:
        reporter.close()
    steps = [p["step"] for r in control_plane.of_kind("metrics", accepted_only=True)
             for p in r["body"]["points"]]
    assert steps == list(range(400))
    assert not drop_reports(control_plane)


def test_a_queue_the_thread_cannot_spill_in_time_drops_events_first_and_says_how_many(
        control_plane):
    # Not started: nothing moves the overflow to disk, so past twice its
    # bound the queue drops, events before checkpoint reports.
    reporter = reporter_for(control_plane, max_events=2)
    reporter.checkpoint({"step": 1, "uri": "file:///c/step-1"})
    for i in range(5):
        reporter.event("tick", f"e{i}")
    reporter.checkpoint({"step": 2, "uri": "file:///c/step-2"})
    assert reporter.dropped == {"events": 3}

    reporter.start()
    try:
        eventually(lambda: drop_reports(control_plane), timeout=20, what="the drop reported")
    finally:
        reporter.close()

    urgent = [(r["kind"], r["body"]) for r in control_plane.requests
              if r["kind"] in ("events", "checkpoints")]
    assert [(kind, body.get("step", body.get("message"))) for kind, body in urgent] == [
        ("checkpoints", 1), ("events", "e3"), ("events", "e4"), ("checkpoints", 2),
        ("events", "reporting buffer overflowed while the control plane was away: 3 events"),
    ]
    assert urgent[-1][1]["data"] == {"events": 3}
    assert all(body["job_id"] == "3" for _, body in urgent)


def test_the_first_step_is_reported_at_once_not_an_interval_later(control_plane):
    reporter = Reporter(control_plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                        heartbeat_interval_s=30.0, job_id="3")
    reporter.start()
    try:
        eventually(lambda: control_plane.of_kind("heartbeat"), timeout=10,
                   what="the start-up heartbeat")
        reporter.update_status(step=1)
        # Within a third of the 30 s interval: the first step woke the reporter.
        eventually(lambda: any(r["body"].get("step") == 1
                               for r in control_plane.of_kind("heartbeat")),
                   timeout=10, interval=0.05, what="a heartbeat carrying step 1")
        reporter.update_status(step=2)
        time.sleep(1.0)
        assert not any(r["body"].get("step") == 2 for r in control_plane.of_kind("heartbeat"))
    finally:
        reporter.close(timeout_s=2)


def test_a_first_step_taken_while_a_heartbeat_is_in_flight_is_still_sent_at_once(control_plane):
    # The interleaving that once held the first step back a whole interval:
    # the step lands after the start-up heartbeat's body was built and before
    # its answer, and the answer's bookkeeping scheduled the next heartbeat
    # 30 s away over it. The server takes the step inside that window.
    reporter = Reporter(control_plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                        heartbeat_interval_s=30.0, job_id="3")

    def step_during_the_first_heartbeat(record):
        # Run under the server's lock, so it reads the list itself.
        if record["kind"] == "heartbeat" and sum(
                r["kind"] == "heartbeat" for r in control_plane.requests) == 1:
            reporter.update_status(step=1)

    control_plane.on_request = step_during_the_first_heartbeat
    reporter.start()
    try:
        eventually(lambda: any(r["body"].get("step") == 1
                               for r in control_plane.of_kind("heartbeat")),
                   timeout=10, interval=0.05, what="a heartbeat carrying step 1")
        assert control_plane.of_kind("heartbeat")[0]["body"]["step"] == 0
    finally:
        reporter.close(timeout_s=2)
