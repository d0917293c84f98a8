"""The reporter's bounded buffer under concurrency: a training thread that
appends while the reporting thread sends, to a real HTTP server that fails
some requests after reading them (so batches are retried)."""

import collections
import threading
import time

import pytest
from regatta.reporting import Reporter

pytestmark = [pytest.mark.timeout(60)]


def wait_until(predicate, timeout=20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def reporter_for(plane, **kwargs) -> Reporter:
    return Reporter(plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                    heartbeat_interval_s=0.05, job_id="3", **kwargs)


def drop_reports(plane) -> list[dict]:
    return [r["body"] for r in plane.of_kind("events", accepted_only=True)
            if r["body"]["kind"] == "reports_dropped"]


def test_points_are_sent_once_or_counted_dropped_and_a_retried_batch_never_changes(
        control_plane):
    seen = collections.Counter()

    def one_report_in_three_fails(record):
        if record["kind"] == "heartbeat":
            return None
        seen[record["kind"]] += 1
        return 503 if seen[record["kind"]] % 3 == 1 else None

    control_plane.status_for = one_report_in_three_fails
    reporter = reporter_for(control_plane, max_metrics=200, max_events=20)
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
            time.sleep(0.0002)

    threads = [threading.Thread(target=train, args=(kind, 2.0)) for kind in produced]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        wait_until(lambda: reporter.pending() == 0 and drop_reports(control_plane)
                   and drop_reports(control_plane)[-1]["data"] == dict(reporter.dropped))
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
    assert sent == sorted(set(sent))  # in order, none twice
    assert reporter.dropped["metrics"] > 0
    assert len(sent) + reporter.dropped["metrics"] == produced["metrics"]

    ticks = [r["body"]["data"]["seq"] for r in control_plane.of_kind("events", accepted_only=True)
             if r["body"]["kind"] == "tick"]
    assert ticks == sorted(set(ticks))
    assert len(ticks) + reporter.dropped["events"] == produced["events"]


def test_a_full_queue_drops_events_before_checkpoint_reports_and_says_how_many(
        control_plane):
    reporter = reporter_for(control_plane, max_events=3)
    reporter.checkpoint({"step": 1, "uri": "file:///c/step-1"})
    for i in range(5):
        reporter.event("tick", f"e{i}")
    reporter.checkpoint({"step": 2, "uri": "file:///c/step-2"})
    assert reporter.dropped == {"events": 4}

    reporter.start()
    try:
        wait_until(lambda: drop_reports(control_plane))
    finally:
        reporter.close()

    urgent = [(r["kind"], r["body"]) for r in control_plane.requests
              if r["kind"] in ("events", "checkpoints")]
    assert [(kind, body.get("step", body.get("message"))) for kind, body in urgent] == [
        ("checkpoints", 1), ("events", "e4"), ("checkpoints", 2),
        ("events", "reporting buffer overflowed while the control plane was away: 4 events"),
    ]
    assert urgent[-1][1]["data"] == {"events": 4}
    assert all(body["job_id"] == "3" for _, body in urgent)
