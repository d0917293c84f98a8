"""A save that fails never ends training: it is reported and taken again
synchronously (issue 11: the second async save crashed ranks on CUDA)."""

import os

import pytest
from regatta.storage import open_storage

from .helpers import free_port, start_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "failing_stager.py")


def test_a_stager_that_raises_is_reported_and_the_save_is_taken_synchronously(
        tmp_path, control_plane):
    folder = tmp_path / "run"
    proc = start_torchrun(
        ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{free_port()}", PROGRAM, str(tmp_path / "ckpt"),
         str(tmp_path / "staging")], control_plane.env(), folder)
    proc.wait(timeout=100)
    log = (folder / "stdout.log").read_text(errors="replace")

    assert proc.returncode == 0, log[-3000:]
    assert "rank 0 trained to step 4; async_enabled=False" in log
    assert "rank 1 trained to step 4; async_enabled=False" in log
    store = open_storage(str(tmp_path / "ckpt"))
    assert store.committed_steps() == [2, 4]
    assert store.verify(2) == (True, "ok") and store.verify(4) == (True, "ok")
    failed = [r["body"] for r in control_plane.of_kind("events")
              if r["body"]["kind"] == "checkpoint_failed"]
    assert len(failed) == 1  # the first failure turns async saves off for the run
    assert failed[0]["data"]["step"] == 2
    assert failed[0]["data"]["fallback"] == "a synchronous save of the same step"
    assert failed[0]["data"]["async_disabled"] is True
    assert failed[0]["data"]["errors"] == [
        "rank 1: staging failed: RuntimeError: cudaHostRegister: out of pinned memory (injected)"]
    reports = sorted(r["body"]["step"] for r in control_plane.of_kind("checkpoints"))
    assert reports == [2, 4]
