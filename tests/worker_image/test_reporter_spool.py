"""While the control plane is away the reporter keeps what it cannot send:
in bounded memory, then on local disk, and at exit in the job's storage
(regatta/spool.py). A real HTTP server answers 503 while "down"."""

import json
import socket
import time
from pathlib import Path

import pytest
from regatta.reporting import Reporter
from regatta.spool import FORMAT, storage_handoff

from tests.support.waiting import eventually

pytestmark = [pytest.mark.timeout(60)]


def down_until_up(plane) -> dict:
    state = {"up": False}
    plane.status_for = lambda record: None if state["up"] else 503
    return state


def reporter_for(plane, **kwargs) -> Reporter:
    return Reporter(plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                    heartbeat_interval_s=0.05, job_id="3", **kwargs)


def produce(reporter, steps: range, pause_every=50, ticks=True) -> None:
    # A training loop's pace (not a wait): the reporting thread gets to run between steps.
    for step in steps:
        reporter.metric("loss", step, float(step))
        if step % pause_every == 0:
            if ticks:
                reporter.event("tick", "", {"step": step})
            time.sleep(0.01)


def accepted_steps(plane) -> list[int]:
    return [p["step"] for r in plane.of_kind("metrics", accepted_only=True)
            for p in r["body"]["points"]]


def test_while_the_control_plane_is_down_the_overflow_waits_on_disk_then_arrives_in_order(
        control_plane):
    web = down_until_up(control_plane)
    reporter = reporter_for(control_plane, max_metrics=100, max_events=5)
    reporter.start()
    try:
        produce(reporter, range(3000))
        eventually(lambda: reporter.metrics.spooled > 2000, timeout=20, what="2000 spooled")
        # Memory holds at most its bound (plus what arrived since the last spill).
        assert len(reporter.metrics.memory) <= 200 and reporter.urgent.spooled > 0
        web["up"] = True
        eventually(lambda: reporter.pending() == 0, timeout=40, what="everything sent")
    finally:
        reporter.close()

    assert accepted_steps(control_plane) == list(range(3000))
    ticks = [r["body"]["data"]["step"] for r in control_plane.of_kind("events", True)]
    assert ticks == list(range(0, 3000, 50))
    assert not reporter.dropped


def test_past_the_disk_bound_the_oldest_go_and_the_loss_is_reported(control_plane):
    web = down_until_up(control_plane)
    reporter = reporter_for(control_plane, max_metrics=100, max_spool_bytes=30_000)
    reporter.start()
    try:
        produce(reporter, range(3000), pause_every=25)
        eventually(lambda: reporter.dropped["metrics"] > 0, timeout=20, what="a drop")
        web["up"] = True
        eventually(lambda: reporter.pending() == 0 and any(
            r["body"]["kind"] == "reports_dropped" for r in control_plane.of_kind("events", True)),
            timeout=20, what="everything sent, the drop reported")
    finally:
        reporter.close()

    sent = accepted_steps(control_plane)
    # What is left is the newest, in order and whole; what went is counted.
    assert sent == list(range(3000 - len(sent), 3000))
    assert len(sent) + reporter.dropped["metrics"] == 3000
    (report,) = [r["body"] for r in control_plane.of_kind("events", True)
                 if r["body"]["kind"] == "reports_dropped"]
    assert report["data"] == {"metrics": reporter.dropped["metrics"]}


def test_at_close_what_is_undelivered_is_handed_off_to_the_jobs_storage_once(
        control_plane, tmp_path):
    down_until_up(control_plane)
    storage = tmp_path / "ckpt"
    reporter = reporter_for(control_plane, max_metrics=100,
                            handoff=storage_handoff(f"file://{storage}"))
    reporter.start()
    reporter.event("started", "fresh start")
    produce(reporter, range(1000), ticks=False)
    reporter.checkpoint({"step": 999, "uri": f"file://{storage}/step-999"})
    reporter.event("finished", "finished at step 999", {"step": 999})
    eventually(lambda: reporter.metrics.spooled > 0, timeout=20, what="a spill")
    spool_folder = reporter.metrics._folder
    started = time.monotonic()
    reporter.close(timeout_s=1.0)

    assert time.monotonic() - started < 3  # a bounded wait, then the hand-off
    (left,) = (storage / "reports" / "attempt-7").glob("rank-0-*.jsonl")
    assert reporter.handed_off_to.startswith("left at reports/attempt-7/rank-0-")
    header, *lines = [json.loads(line) for line in left.read_text().splitlines()]
    assert header["format"] == FORMAT and header["rank"] == 0 and header["job_id"] == "3"
    urgent = [(line["endpoint"], line["body"].get("kind", line["body"].get("step")))
              for line in lines if line["endpoint"] != "metrics"]
    assert urgent == [("events", "started"), ("checkpoints", 999), ("events", "finished")]
    keys = [line["body"]["key"] for line in lines if line["endpoint"] == "events"]
    assert len(set(keys)) == 2 and all(k.startswith("j3-a7-r0-") for k in keys)
    points = [p["step"] for line in lines if line["endpoint"] == "metrics"
              for p in line["body"]["points"]]
    # Once each, a batch in flight included.
    assert sorted(points) == list(range(1000)) and len(points) == 1000
    assert not Path(spool_folder).exists()


def test_nothing_is_handed_off_when_everything_was_delivered(control_plane, tmp_path):
    reporter = reporter_for(control_plane, handoff=storage_handoff(str(tmp_path)))
    reporter.start()
    reporter.event("finished", "done")
    produce(reporter, range(10))
    reporter.close(timeout_s=5.0)

    assert reporter.handed_off_to is None and not list(tmp_path.rglob("*.jsonl"))
    assert len(control_plane.of_kind("events", True)) == 2


def test_a_runs_reporter_leaves_what_it_could_not_deliver_in_the_launchs_checkpoint_uri(
        tmp_path):
    # How regatta.init wires its reporter: from the launch contract alone.
    from regatta import reporting
    from regatta.launch import Launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens: the web is down
    launch = Launch.from_env({"REGATTA_URL": dead, "REGATTA_TOKEN": "rgw_test",
                              "REGATTA_JOB_ID": "3", "REGATTA_ATTEMPT_ID": "7",
                              "REGATTA_CHECKPOINT_URI": f"file://{tmp_path}/ckpt"})
    reporter = reporting.from_env(launch.env(), 0, 0.1)
    reporter.start()
    reporter.event("finished", "finished at step 3", {"step": 3})
    reporter.close(timeout_s=0.5)

    (left,) = (tmp_path / "ckpt" / "reports" / "attempt-7").glob("rank-0-*.jsonl")
    assert '"kind": "finished"' in left.read_text()


def test_after_an_outage_the_rank_is_heard_from_within_one_heartbeat_interval(control_plane):
    # A web restart must not outlast the control plane's heartbeat deadline
    # because the rank backed off past it.
    web = down_until_up(control_plane)
    reporter = Reporter(control_plane.url, "rgw_test", "7", rank=0, node="local-a-0",
                        heartbeat_interval_s=1.0, job_id="3")
    reporter.start()
    try:
        # Not a wait: the outage must last long enough for the backoff to grow.
        time.sleep(8.0)  # the web is away
        web["up"] = True
        back = time.time()
        eventually(lambda: control_plane.of_kind("heartbeat", accepted_only=True), timeout=20,
                   what="a heartbeat accepted")
    finally:
        reporter.close()

    heard = control_plane.of_kind("heartbeat", accepted_only=True)[0]["time"]
    assert heard - back < 1.5
