"""`regatta.init()` and the `Run` it returns: the SDK's public surface.

One `Run` per rank. It reads the launch contract (regatta/launch.py), joins
or makes the process group, reports from a background thread
(regatta/reporting.py), checkpoints into `step-N/` folders with a manifest
and a commit marker (regatta/checkpoint.py), resumes from the checkpoint the
control plane chose, and agrees directives and SIGTERM across ranks without
a per-step host sync (regatta/agreement.py). docs/sdk.md is the reference.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from regatta import dist as rdist
from regatta import gpu, loading, preemption, reporting, startup
from regatta.agreement import Decision, Directives
from regatta.checkpoint import Checkpointer, open_for_writing
from regatta.contract import EXIT_COLLECTIVE, EXIT_OK, EXIT_PREEMPTED, FAILURE_CLASS
from regatta.launch import Launch
from regatta.loading import Resumed
from regatta.profiling import Profiler
from regatta.retention import retention_for
from regatta.state import Export
from regatta.status import write_status
from regatta.storage import open_storage

log = logging.getLogger("regatta")


class _OnHost:
    """A CUDA tensor on its way to host memory: `run.log` never waits for it;
    the reporting thread sends it once the copy's event has completed."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.value = tensor.detach().to("cpu", non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def ready(self) -> bool:
        return self.event.query()

    def get(self) -> float:
        return self.value.float().item()


class _OptimizerSteps:
    """Optimizer steps begun and ended in this process, counted by torch's
    global optimizer hooks. A survivor's hand-over needs to know that the
    state it holds is the state at the end of the last step boundary: no
    optimizer has moved it since, and none is half-way through moving it."""

    begun = ended = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True

        def begin(*_):
            cls.begun += 1

        def end(*_):
            cls.ended += 1

        register_optimizer_step_pre_hook(begin)
        register_optimizer_step_post_hook(end)


def _sharded(state: Any) -> bool:
    """Whether `state` is split across ranks (FSDP, DTensor), so that no
    single rank holds it whole. Looked at in the modules first, since
    asking a sharded model for its state dict may itself be collective."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    from regatta.state import ModelState

    parts = list(state.values()) if isinstance(state, dict) else [state]
    for part in parts:
        if isinstance(part, DTensor):
            return True
        if isinstance(part, ModelState) and (
                any(isinstance(m, FullyShardedDataParallel) for m in part.model.modules())
                or any(isinstance(t, DTensor) for t in part.model.parameters())):
            return True  # FSDP1 wraps modules; FSDP2 makes the parameters DTensors
    return False


def _loggable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _OnHost(value) if value.is_cuda else value.detach().float().item()
    return float(value)


class Run:
    """One rank of a training run. Made by `regatta.init()`."""

    def __init__(self, launch: Launch, d: rdist.Dist, reporter, ckpt: Checkpointer,
                 guard: preemption.Preemption, checkpoint_every: int,
                 async_checkpoint: bool) -> None:
        self.launch, self.d, self.reporter, self.ckpt = launch, d, reporter, ckpt
        self.guard = guard
        self.async_checkpoint = async_checkpoint
        self.directives = Directives(d, reporter, checkpoint_every)
        self.profiler = Profiler(d.rank, d.device, ckpt.storage, reporter)
        self.step = 0
        self.closed = False
        self._stop_seen = True  # should_stop() runs a boundary of its own when True
        self._armed = False
        # What a survivor hands over with no code of the program's own
        # (`hand_over_after`): the state last saved or resumed into, whether
        # its rank state is the program's (per rank, so lost with the dead
        # ranks), and the last boundary's step with the optimizer steps ended
        # by then.
        self._state: Any = None
        self._per_rank_state = False
        self._boundary_at: tuple[int, int] | None = None
        self._handover_tried = False
        self._stepped = False
        _OptimizerSteps.install()

    # -- who and where ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.d.rank

    @property
    def world_size(self) -> int:
        return self.d.world_size

    @property
    def local_rank(self) -> int:
        return self.d.local_rank

    @property
    def device(self) -> torch.device:
        return self.d.device

    @property
    def storage(self):
        return self.ckpt.storage

    # -- reporting ----------------------------------------------------------------------
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Metric points for `step`. Never blocks: tensors on the GPU are
        copied to the host asynchronously and sent once there; the buffer is
        bounded, what overflows is counted and reported."""
        self.step = max(self.step, step)
        self._first_step()
        self.reporter.update_status(step=self.step)
        for name, value in metrics.items():
            self.reporter.metric(name, step, _loggable(value))

    def status(self, **progress: Any) -> None:
        """What the next heartbeat carries: step, tokens_per_s, samples_per_s,
        step_time_s."""
        if "step" in progress:
            self.step = max(self.step, int(progress["step"]))
            self._first_step()
        self.reporter.update_status(**progress)

    def _first_step(self) -> None:
        # The one start-up marker past the first step (regatta/startup.py).
        if not self._stepped and self.step > 0:
            self._stepped = True
            startup.mark("stepping", step=self.step)

    def event(self, kind: str, message: str = "", **data: Any) -> None:
        """An event on the job's timeline (snake_case kind), from this rank."""
        self.reporter.event(kind, message, data)

    def _main_event(self, kind: str, message: str, data: dict) -> None:
        # Run-level events come from rank 0 alone; `crashed` from every rank.
        if self.rank == 0:
            self.reporter.event(kind, message, data)

    # -- directives and SIGTERM -------------------------------------------------------
    def should_checkpoint(self, step: int) -> bool:
        """Whether to save at `step`: the job's every-N policy, the control
        plane's auto interval, a "checkpoint now" request, or the synchronous
        retake of a failed async save. Collective: call it once per step on
        every rank; every rank gets the same answer at the same step."""
        d = self._boundary(step)
        if d.stop:
            return False  # the emergency checkpoint after should_stop() is the save
        every = self.directives.checkpoint_every
        periodic = bool(every) and step % every == 0
        return periodic or d.request_id is not None or d.fallback

    def should_stop(self, step: int | None = None) -> bool:
        """Whether to stop now (a stop directive, a drain, a spot notice:
        SIGTERM on any rank): then take the emergency checkpoint and call
        `exit_preempted`. Uses this step's boundary when `should_checkpoint`
        already ran it; otherwise runs one (collective, like it)."""
        if step is not None:
            self._boundary(step)
        elif self._stop_seen:
            self._boundary(self.directives.decision.step + 1)
        self._stop_seen = True
        return self.stopping

    @property
    def stopping(self) -> bool:
        return self.directives.stopping

    @property
    def checkpoint_every(self) -> int:
        return self.directives.checkpoint_every

    def _boundary(self, step: int) -> Decision:
        if step == self.directives.decision.step:
            return self.directives.decision
        self._arm()
        self.step = max(self.step, step)
        self._first_step()
        self._stop_seen = False
        # The program calls this at the end of step N: what it holds now is
        # step N's state, unless an optimizer is half-way through a step.
        whole = _OptimizerSteps.begun == _OptimizerSteps.ended
        self._boundary_at = (step, _OptimizerSteps.ended) if whole else None
        decision = self.directives.boundary(step, self.ckpt)
        # Here, on the boundary every rank reaches at the same step, so that a
        # profile covers the same steps everywhere (regatta/profiling.py).
        self.profiler.at_boundary(step, decision.profile)
        return decision

    def _on_sigterm(self) -> None:
        if not self.directives.sigterm:
            log.warning("SIGTERM: finishing this step, then an emergency checkpoint")
        self.directives.sigterm = True

    def _arm(self) -> None:
        """From here on SIGTERM is a flag the ranks agree on, not an exit."""
        if not self._armed:
            self._armed = True
            self.guard.training(self._on_sigterm)

    def phase(self, name: str) -> None:
        """Name what the rank does before training (it goes into the report
        of a SIGTERM that comes then)."""
        self.guard.enter(name)

    # -- checkpoints -------------------------------------------------------------------
    def checkpoint(self, step: int, state: Any, *, rank_state: Any = None,
                   export: Export | None = None, sync: bool | None = None) -> bool:
        """Save `state` (a dict of tensors and `Stateful`s, or a `Stateful`
        such as `regatta.ModelState(model, optimizer)`) as step-N with DCP,
        sharded. Collective. Async by default, except after `should_stop()`
        (the emergency checkpoint) and with `export`; `rank_state` is any
        picklable per-rank object (RNG states, data position). Never raises
        for a failed save: it is reported and retaken (see docs/sdk.md)."""
        self._state = state
        self._per_rank_state = self._per_rank_state or rank_state is not None
        if self._saved(step) and (export is None or self._exported(step)):
            return True
        use_async = self.async_checkpoint and not self.stopping and not sync
        request_id = self.directives.request_for(step)
        self.step = max(self.step, step)
        return self.ckpt.save(step, state, self._rank_state(rank_state),
                              use_async=use_async, emergency=self.stopping,
                              request_id=request_id, export=export)

    def hand_over(self, step: int, state: Any, rank_states: Mapping[int, Any], *,
                  cause: str = "") -> bool:
        """After a peer died (a collective failed), save step-N from this
        rank alone, with no collective, for the relaunch to resume from:
        `state` as for `checkpoint` but held whole by this rank (DDP), and
        `rank_states` every rank's `rank_state` by rank. The first survivor
        to finish writes it, the others find it written; the writer puts
        `survivor_handover` on the timeline. Never raises: a hand-over that
        fails leaves the newest checkpoint as it was. Returns whether
        step-N is committed now."""
        self._handover_tried = True
        states = {r: self._rank_state(s) for r, s in rank_states.items()}
        try:
            outcome = self.ckpt.hand_over(step, state, states)
        except Exception as exc:  # the relaunch resumes from the checkpoint before
            log.exception("handing over step %d failed", step)
            outcome = f"{type(exc).__name__}: {exc}"
        if outcome == "written":
            self.reporter.event("survivor_handover", (
                f"step-{step} written by rank {self.rank} after a peer failed; the relaunch "
                f"resumes from it, no step rolled back")[:500],
                {"step": step, "rank": self.rank, "cause": cause[:300]})
        elif outcome != "taken":
            self.hand_over_impossible(step, outcome)
        return outcome in ("written", "taken")

    def hand_over_impossible(self, step: int, why: str) -> None:
        """Say on the timeline (from each node's first rank) that the state of
        step-N could not be handed over: the relaunch rolls back to the
        newest checkpoint."""
        self._handover_tried = True
        log.warning("no hand-over of step %d: %s", step, why)
        if self.launch.local_rank == 0:
            self.reporter.event("survivor_handover_failed", f"step-{step}: {why}"[:500],
                                {"step": step, "rank": self.rank})

    def hand_over_after(self, cause: BaseException) -> None:
        """The survivor hand-over with no code of the program's own, when a
        collective raised and nothing caught it: the state last given to
        `checkpoint` or `resume`, as it was at the last step boundary, is
        handed over as that step. Only when that is sure: an optimizer has
        not stepped since the boundary, the state is held whole (not FSDP),
        and the program keeps no per-rank `rank_state` (which a survivor
        cannot rebuild for the dead ranks). Otherwise the timeline says why
        the relaunch rolls back. Nothing happens for a step already saved or
        resumed from, or when the program handed over itself."""
        at = self._boundary_at
        if self._handover_tried or at is None or at[0] == self.ckpt.last_committed:
            return
        step, ended = at
        if self._state is None:
            why = "the program saves files of its own (checkpoint_files), not a state to hand over"
        elif _OptimizerSteps.ended != ended or _OptimizerSteps.begun != ended:
            why = "an optimizer stepped after the step boundary: the state is past that step"
        elif _OptimizerSteps.ended == 0:
            why = "no torch optimizer step seen: the end of a step cannot be told"
        elif self._per_rank_state:
            why = "the program keeps a rank_state per rank, lost with the dead ranks"
        elif _sharded(self._state):
            why = "the state is sharded (FSDP): the dead ranks' shards are lost"
        else:
            self.hand_over(step, self._state, dict.fromkeys(range(self.world_size)),
                           cause=f"{type(cause).__name__}: {cause}")
            return
        self.hand_over_impossible(step, why)

    def checkpoint_dir(self, step: int) -> Path:
        """A local folder to write step-N's files into, for `checkpoint_files`."""
        path = self.ckpt.step_dir(step)
        if self._holds(step):
            # Saved already in this run (a periodic save, then the stop
            # path's at the same step): `checkpoint_files` keeps that commit.
            path.mkdir(parents=True, exist_ok=True)
            return path
        return open_for_writing(path)

    def checkpoint_files(self, step: int, folder: str | os.PathLike | None = None) -> bool:
        """Commit files the program wrote (an HF `save_pretrained` folder, a
        Lightning `.ckpt`) as step-N: from `folder` (copied in), or what it
        wrote into `checkpoint_dir(step)`. Collective and synchronous; a
        rank with nothing to add passes a folder of its own or nothing."""
        if self._saved(step):
            return True
        request_id = self.directives.request_for(step)
        self.step = max(self.step, step)
        return self.ckpt.save_files(step, Path(folder) if folder is not None else None,
                                    emergency=self.stopping, request_id=request_id)

    def _saved(self, step: int) -> bool:
        """Whether step-N is saved already (a periodic save, then the stop
        path's at the same step): it is not taken twice. When stopping, an
        async save in flight is finished first."""
        if self.stopping:
            self.settle()
        return self._holds(step)

    def _exported(self, step: int) -> bool:
        """Whether the saved step-N carries its `export/` model. A final save
        asks for one whatever took that step before it (an emergency save at
        the last step, then a resumed run's finish): without it, step-N is
        saved again with it, so a finished run always leaves one."""
        manifest = self.ckpt.storage.read_manifest(step) or {}
        return any(rel.startswith("export/") for rel in manifest.get("files") or {})

    def _holds(self, step: int) -> bool:
        """Step-N committed by this run, or its save in flight."""
        pending = self.ckpt.pending
        return self.ckpt.last_committed == step or (pending is not None and pending.step == step)

    def _rank_state(self, rank_state: Any) -> dict:
        # The run's own state travels with the program's, so that a resumed
        # run neither serves a checkpoint request twice nor loses an interval
        # the control plane set.
        return {"regatta": self.directives.state_dict(), "rank_state": rank_state}

    def resume(self, state: Any = None, *, info: Mapping[str, Any] | None = None
               ) -> Resumed | None:
        """Load the checkpoint the control plane chose (REGATTA_RESUME_URI or
        REGATTA_RESUME_STEP; standalone, the newest verified), verified
        against its manifest; None to start fresh. With `state`, DCP state
        is loaded into it in place; without, `Resumed.path` is the step's
        folder (downloaded first from S3). Collective. Sends `started` (with
        `info`) and `resumed` events."""
        if state is not None:
            self._state = state
        step = loading.choose(self.ckpt, self.launch.resume_step, self.launch.resume_uri,
                              self._skipped)
        where = f"resuming from step {step}" if step is not None else "starting from scratch"
        self._main_event("started", f"{self.world_size} ranks, {where}",
                         {**(info or {}), "world_size": self.world_size, "resume_from": step})
        if step is None:
            self._arm()
            return None
        if state is None:
            path, _ = loading.local_folder(self.ckpt, step)
            resumed = Resumed(step, self.storage.step_uri(step), None, path)
            self.ckpt.last_committed = step
        else:
            resumed = self._restore(loading.load_state(self.ckpt, step, state))
        self.step = step
        log.info("resumed from %s (step %d)", resumed.uri, step)
        self._main_event("resumed", f"resumed from step {step}",
                         {"step": step, "uri": resumed.uri})
        self._arm()
        return resumed

    def _restore(self, resumed: Resumed) -> Resumed:
        saved = resumed.rank_state if isinstance(resumed.rank_state, dict) else {}
        self.directives.load_state_dict(saved.get("regatta", {}))
        resumed.rank_state = saved.get("rank_state")
        return resumed

    def _skipped(self, step: int, reason: str) -> None:
        log.warning("checkpoint_skipped step-%d: %s", step, reason)
        self.reporter.event("checkpoint_skipped", reason, {"step": step, "reason": reason})

    # -- the end ------------------------------------------------------------------------
    def settle(self) -> None:
        """Wait for the agreement in flight and commit a pending save (every
        rank, at the same step): before the final or emergency checkpoint."""
        self.directives.agreement.drain()
        if self.ckpt.pending is not None:
            self.ckpt.commit_pending()

    def finish(self, step: int | None = None) -> None:
        """The run succeeded: commit what is pending, send `finished`, write
        the status file (exit 0), stop reporting and free the SDK's process
        groups (the program's default group is left to it)."""
        self.settle()
        step = self.step if step is None else step
        self._main_event("finished", f"finished at step {step}", {"step": step})
        self.close(EXIT_OK, None, step)
        self.d.leave()

    def preempted(self, step: int | None = None) -> int:
        """After the emergency checkpoint: the `emergency_checkpoint` event,
        status 83; returns 83 (`exit_preempted` exits with it)."""
        self.settle()
        step = self.step if step is None else step
        self._main_event("emergency_checkpoint", f"emergency checkpoint at step {step}",
                         {"step": step, "uri": self.storage.step_uri(step),
                          "committed": self.ckpt.last_committed == step})
        self.close(EXIT_PREEMPTED, "stopped: emergency checkpoint taken", step)
        return EXIT_PREEMPTED

    def exit_preempted(self, step: int | None = None) -> NoReturn:
        """`preempted`, then exit with code 83 (what the control plane reads
        as "preempted, resume me")."""
        _exit(self.preempted(step))

    def crashed(self, exc: BaseException, code: int) -> None:
        """Report an exception that ends the run (every rank sends its own)."""
        summary = _summary(exc)
        log.error("crashed (exit %d, %s):\n%s", code, FAILURE_CLASS[code], summary)
        self.reporter.event("crashed", f"{type(exc).__name__}: {exc}"[:500], {
            "error_type": type(exc).__name__, "traceback": summary,
            "failure_class": FAILURE_CLASS[code]})

    def close(self, code: int, error: str | None = None, step: int | None = None) -> None:
        """Write the status file and flush the reports (once)."""
        if self.closed:
            return
        self.closed = True
        # A profile the run outlived is written as far as it got.
        self.profiler.finish(self.step if step is None else step)
        self.ckpt.close()
        write_status(self.launch, code, error, self.step if step is None else step)
        self.reporter.close(timeout_s=5.0)

    def preempted_early(self, phase: str) -> None:
        """SIGTERM before training: nothing to save; report and exit 83."""
        message = f"SIGTERM during {phase}, before training started: no checkpoint taken"
        self.reporter.event("preempted", message, {"phase": phase, "step": 0,
                                                   "checkpoint": False})
        self.close(EXIT_PREEMPTED, message, 0)
        _exit(EXIT_PREEMPTED)


def _summary(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) < 4000 else text[:1000] + "\n...\n" + text[-3000:]


def _exit(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: on CPU, gloo ranks can otherwise abort in interpreter
    # teardown (c10d destructors) and turn a clean exit into a crash.
    os._exit(code)


def init(*, config: Mapping[str, Any] | None = None, checkpoint_every: int | None = None,
         keep_last: int = 3, async_checkpoint: bool = True, heartbeat_interval_s: float = 5.0,
         startup_timeout_s: float = 1800.0, launch: Launch | None = None,
         staging_dir: str | os.PathLike | None = None, stager_factory=None) -> Run:
    """Start this rank's run from the launch contract in the environment.

    Joins the process group the program made, or makes one (NCCL with CUDA,
    gloo without). `config` is written to each checkpoint as config.json;
    `checkpoint_every` defaults to REGATTA_CHECKPOINT_EVERY (0: only when
    asked); `keep_last` applies only without a control plane (with one, it
    prunes). Reporting starts at once (heartbeats from a background thread).
    """
    launch = launch or Launch.from_env()
    guard = preemption.install()
    guard.enter("rendezvous")
    d = rdist.init(startup_timeout_s)
    reporter = reporting.from_env(launch.env(), d.rank, heartbeat_interval_s,
                                  gpu.nvml_sampler(d.device))
    reporter.start()
    staging = Path(staging_dir or Path(tempfile.gettempdir()) / "regatta-staging")
    ckpt = Checkpointer(open_storage(launch.checkpoint_uri), d,
                        dict(config) if config is not None else None, staging,
                        retention_for(launch.managed, keep_last), reporter, stager_factory)
    every = launch.checkpoint_every if checkpoint_every is None else checkpoint_every
    run = Run(launch, d, reporter, ckpt, guard, every, async_checkpoint)
    guard.on_early = run.preempted_early
    guard.enter("setup")
    _report_uncaught(run)
    return run


def _report_uncaught(run: Run) -> None:
    """An exception nobody caught ends the rank as the built-in trainer's
    would: a lost peer's first hands over the last step (`hand_over_after`),
    then a `crashed` event, the status file, the exit code of its class (84
    for a lost peer, 1 for anything else)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        if run.closed or not isinstance(exc, Exception):
            return
        code = rdist.classify(exc)
        if code == EXIT_COLLECTIVE:
            run.hand_over_after(exc)
        run.crashed(exc, code)
        run.close(code, f"{exc_type.__name__}: {exc}")
        _exit(code)

    sys.excepthook = hook
