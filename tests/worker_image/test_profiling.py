"""Profiling on demand in the ranks: the `profile` directive reaches every
rank of a real 2-rank gloo torchrun run at the same step, and each rank
writes a gzipped Chrome trace of the same steps beside the checkpoints and
reports it (worker_image/regatta/profiling.py). The user's SDK program and
the built-in trainer alike, against a real HTTP stand-in for the control
plane."""

import gzip
import json
from pathlib import Path

import pytest
from regatta.storage import open_storage, profile_key

from .test_s3 import s3_env  # noqa: F401
from .test_sdk import Program

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 3


def traces(control_plane, ckpt: Path, request_id: str) -> dict[int, tuple[dict, dict]]:
    """rank -> (its report, its trace read back from storage)."""
    reports = [r["body"] for r in control_plane.of_kind("profiles")]
    found = {}
    for rep in reports:
        assert rep["request_id"] == request_id
        path = ckpt / profile_key(rep["start_step"], request_id, rep["rank"])
        assert rep["uri"] == f"file://{path}"
        data = path.read_bytes()
        assert rep["bytes"] == len(data)
        with gzip.open(path, "rt") as f:
            found[rep["rank"]] = (rep, json.load(f))
    assert len(found) == len(reports)  # one report per rank, served once
    return found


def profiled_steps(trace: dict) -> list[int]:
    return sorted({int(e["name"].split("#")[1]) for e in trace["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"})


def assert_same_window(found: dict) -> None:
    assert set(found) == {0, 1}
    windows = {(rep["start_step"], rep["steps"]) for rep, _ in found.values()}
    assert len(windows) == 1 and next(iter(windows))[1] == STEPS
    start = next(iter(windows))[0]
    for _, trace in found.values():
        assert profiled_steps(trace) == list(range(start, start + STEPS))
        assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])


def test_an_sdk_program_profiles_the_same_steps_on_every_rank(tmp_path, control_plane):
    control_plane.directives["profile"] = {"request_id": "prof-1", "steps": STEPS}
    ckpt = tmp_path / "ckpt"
    run = Program(tmp_path, "profiled", ckpt, steps=30, sleep=0.05, every=0,
                  env=control_plane.env()).wait()

    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    assert_same_window(traces(control_plane, ckpt, "prof-1"))


def test_a_malformed_profile_directive_is_ignored(tmp_path, control_plane):
    control_plane.directives["profile"] = {"request_id": "prof-2", "steps": 500}
    ckpt = tmp_path / "ckpt"
    run = Program(tmp_path, "ignored", ckpt, steps=8, sleep=0.05, every=0,
                  env=control_plane.env()).wait()

    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    assert control_plane.of_kind("profiles") == []
    assert not (ckpt / "profiles").exists()


def test_the_built_in_trainer_profiles_on_the_directive(launcher, tmp_path, control_plane):
    control_plane.directives["profile"] = {"request_id": "prof-3", "steps": STEPS}
    ckpt = tmp_path / "ckpt"
    run = launcher.run({"max_steps": 20, "checkpoint_every_steps": 0}, ckpt,
                       env=control_plane.env())

    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    found = traces(control_plane, ckpt, "prof-3")
    assert_same_window(found)
    assert next(iter(found.values()))[0]["start_step"] + STEPS - 1 <= 20


def test_a_trainer_on_s3_writes_its_traces_under_the_job_s_prefix(
        s3_env, launcher, control_plane):  # noqa: F811
    control_plane.directives["profile"] = {"request_id": "prof-4", "steps": STEPS}
    uri = "s3://ckpts/jobs/9"
    run = launcher.run({"max_steps": 20, "checkpoint_every_steps": 0}, uri,
                       env={**s3_env, **control_plane.env()})

    assert run.exit_codes() == {0: 0, 1: 0}, run.log()[-3000:]
    reports = sorted((r["body"] for r in control_plane.of_kind("profiles")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    store = open_storage(uri)
    for rep in reports:
        key = profile_key(rep["start_step"], "prof-4", rep["rank"])
        assert rep["uri"] == f"{uri}/{key}"
        trace = json.loads(gzip.decompress(store.read_bytes(key)))
        assert len(profiled_steps(trace)) == STEPS
