"""Profiling on demand: "profile the next N steps", from the control plane.

The directive (`profile: {request_id, steps}` on heartbeat replies) is agreed
like a checkpoint request (regatta/agreement.py): every rank learns it at the
same step boundary S-1 and profiles steps S..S+N-1 with `torch.profiler`
(CPU always, CUDA when the rank runs on a GPU), each step marked with
`ProfilerStep#k`. At the boundary of step S+N-1, or when the run ends first,
each rank exports a Chrome/Perfetto trace, gzips it and writes it through the
run's storage (local or S3) at `profiles/step-S-<request id>/rank-<r>.json.gz`
(`regatta.storage.profile_key`), then reports it (`profiles` worker
endpoint). A failure to profile or to write is reported as an event and never
stops training.
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from regatta.storage import profile_key

log = logging.getLogger("regatta")


@dataclass
class Window:
    request_id: str
    start_step: int
    steps: int
    prof: profile

    @property
    def end_step(self) -> int:
        return self.start_step + self.steps - 1


def _always_record(step: int) -> ProfilerAction:
    # A schedule only so that the profiler marks each step (ProfilerStep#k);
    # the window itself is opened and closed by hand at the step boundaries.
    return ProfilerAction.RECORD


def activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda" and torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return acts


class Profiler:
    """One rank's on-demand profiling window (at most one at a time)."""

    def __init__(self, rank: int, device: torch.device, storage, reporter) -> None:
        self.rank, self.device, self.storage, self.reporter = rank, device, storage, reporter
        self.window: Window | None = None

    @property
    def active(self) -> bool:
        return self.window is not None

    def at_boundary(self, step: int, request: tuple[str, int] | None) -> None:
        """Called by every rank at the boundary after `step`, with the
        profile request agreed there (if any)."""
        window = self.window
        if window is not None:
            if step >= window.end_step:
                self.finish(step)
            else:
                window.prof.step()  # closes ProfilerStep#step, opens the next
        if request is not None:
            if self.window is not None:
                log.warning("profile %s ignored: profile %s is still running",
                            request[0], self.window.request_id)
                return
            self.begin(request[0], request[1], step + 1)

    def begin(self, request_id: str, steps: int, start_step: int) -> None:
        try:
            prof = profile(activities=activities(self.device), schedule=_always_record)
            prof.step_num = start_step  # the markers then name the training steps
            prof.start()
        except Exception as exc:  # a profiler that cannot start must not stop training
            self._failed(request_id, start_step, f"could not start the profiler: {exc}")
            return
        self.window = Window(request_id, start_step, steps, prof)
        log.info("profiling steps %d..%d (request %s)", start_step,
                 start_step + steps - 1, request_id)

    def finish(self, last_step: int) -> None:
        """Stop, export, write and report the trace of steps start..last_step
        (fewer than asked for when the run ended first)."""
        window, self.window = self.window, None
        if window is None:
            return
        steps = max(0, last_step - window.start_step + 1)
        try:
            window.prof.stop()
            data = gzip.compress(self._chrome_trace(window.prof), compresslevel=6)
            key = profile_key(window.start_step, window.request_id, self.rank)
            self.storage.write_bytes(key, data)
        except Exception as exc:
            self._failed(window.request_id, window.start_step, f"{type(exc).__name__}: {exc}")
            return
        uri = f"{self.storage.uri}/{key}"
        log.info("profile of steps %d..%d written to %s", window.start_step, last_step, uri)
        self.reporter.profile({"request_id": window.request_id, "rank": self.rank,
                               "start_step": window.start_step, "steps": steps, "uri": uri,
                               "bytes": len(data)})

    @staticmethod
    def _chrome_trace(prof: profile) -> bytes:
        # export_chrome_trace writes to a path; a private temporary file keeps
        # ranks that share a machine apart.
        fd, path = tempfile.mkstemp(prefix="regatta-trace-", suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    def _failed(self, request_id: str, start_step: int, reason: str) -> None:
        log.warning("profile %s failed: %s", request_id, reason)
        self.reporter.event("profile_failed", reason[:500],
                            {"request_id": request_id, "start_step": start_step})
