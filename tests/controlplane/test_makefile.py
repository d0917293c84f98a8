"""`make test` keeps its state apart from `make run`'s: its own SQLite test
database and embedded broker socket, in a folder that can be overridden."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def state_dir_seen_by(target, tmp_path, **env) -> str:
    # A copy of the Makefile whose "python" reports the state folder it was
    # given; -o keeps make from (re)building the virtualenv (whole, or the
    # control plane and the fleet's part that `make run` asks for).
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\necho "state=${REGATTA_STATE_DIR}"\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "REGATTA_STATE_DIR"}
    result = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed-stamp", "-o", ".venv/.controlplane-stamp",
         "-o", ".venv/.fleet-stamp", f"PY={fake}", target],
        cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line.startswith("state=")][-1]


def test_make_test_uses_its_own_state_folder_by_default(tmp_path):
    assert state_dir_seen_by("test", tmp_path) == f"state={tmp_path}/.regatta/test"


def test_make_test_fast_uses_the_same_state_folder(tmp_path):
    assert state_dir_seen_by("test-fast", tmp_path) == f"state={tmp_path}/.regatta/test"


def test_make_test_keeps_a_state_folder_given_in_the_environment(tmp_path):
    # .ci/run sets its own.
    seen = state_dir_seen_by("test", tmp_path, REGATTA_STATE_DIR="/srv/ci-state")
    assert seen == "state=/srv/ci-state"


def test_make_run_keeps_the_default_state_folder(tmp_path):
    # The recipe chain runs migrate and the demo first; with a fake python
    # each prints, and none may see the test folder.
    assert state_dir_seen_by("run", tmp_path) == "state="
