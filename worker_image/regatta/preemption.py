"""SIGTERM from the first line of a rank to its exit.

A node drain, a spot notice or a stop ends in SIGTERM to torchrun, which
passes it to every rank. What a rank does depends on how far it got:

- before the training loop (config, rendezvous, model build, resume load)
  there is no state worth saving: it exits 83 at once, with its status file
  and a `preempted` event when reporting is up;
- once the loop runs (from `Run.resume()`, or a run's first step boundary),
  SIGTERM only raises the run's flag: the step finishes, every rank agrees
  to stop (`Run.should_stop()`), the emergency checkpoint is taken, and the
  rank exits 83 (`Run.exit_preempted`).

A program calls `regatta.preemption.install()` as its first line, before
`import torch`; `regatta.init()` installs it too if the program did not
(then a thread torch started may take the signal first, and the Python
handler, which runs once the main thread is back in Python, is the net).

The signal is taken by a thread blocked in `sigwait`, not only by a Python
handler: a handler runs when the main thread is back in the interpreter, and
during rendezvous or a collective load the main thread can sit in C++ for as
long as `startup_timeout_s`. For the thread to see the signal, SIGTERM is
blocked in every other thread, which is why `install` must run before torch
(which starts a thread on import) is imported. Once training starts the
main thread unblocks it again, so processes it spawns from then on (e.g.
torch.compile's workers) do not inherit a blocked SIGTERM.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from collections.abc import Callable

from regatta import startup
from regatta.contract import EXIT_PREEMPTED

log = logging.getLogger("regatta")

_SIGTERM = {signal.SIGTERM}


class Preemption:
    def __init__(self, on_early: Callable[[str], None]) -> None:
        self.phase = "start"
        # Called (from whichever thread took the signal) with the phase name
        # when SIGTERM comes before training; it is expected to exit the process.
        self.on_early = on_early
        self._on_stop: Callable[[], None] | None = None
        self._received = False
        # Re-entrant: the Python handler can run on the main thread while
        # that thread holds the lock in `training`.
        self._lock = threading.RLock()

    def install(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGTERM)
        # Also a Python handler: a thread that existed before the mask was set
        # could still be picked for the signal, and then the default action
        # would kill the rank with no status.
        signal.signal(signal.SIGTERM, lambda signum, frame: self.deliver())
        threading.Thread(target=self._wait, name="regatta-sigterm", daemon=True).start()

    def _wait(self) -> None:
        while True:
            signal.sigwait(_SIGTERM)
            self.deliver()

    def enter(self, phase: str) -> None:
        """Name what the rank is doing now (it goes into the early-exit report,
        and into the start-up marker its launcher reads: regatta/startup.py)."""
        self.phase = phase
        startup.mark(phase)

    def training(self, on_stop: Callable[[], None]) -> None:
        """From here on SIGTERM calls `on_stop` (finish the step, emergency
        checkpoint) instead of exiting at once."""
        with self._lock:
            self.phase = "training"
            self._on_stop = on_stop
            already = self._received
        startup.mark("training")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGTERM)
        if already:
            on_stop()

    def deliver(self) -> None:
        with self._lock:
            first = not self._received
            self._received = True
            on_stop = self._on_stop
        if on_stop is not None:
            on_stop()
        elif first:
            log.warning("SIGTERM during %s, before training: exiting without a checkpoint",
                        self.phase)
            self.on_early(self.phase)


_installed: Preemption | None = None


def install(on_early: Callable[[str], None] | None = None, *,
            launch=None) -> Preemption:
    """Take SIGTERM from here on (once per process; later calls return the
    same object, with `on_early` replaced when one is given). `launch`: the
    rank's launch contract where the caller has parsed it already (the
    built-in trainer reads its own arguments); the early exit then reports
    with it instead of reading the environment."""
    global _installed
    if on_early is None and launch is not None:
        on_early = functools.partial(exit_early, launch=launch)
    if _installed is None:
        _installed = Preemption(on_early or exit_early)
        _installed.install()
    elif on_early is not None:
        _installed.on_early = on_early
    return _installed


def exit_early(phase: str, launch=None) -> None:
    """SIGTERM before training: status file, `preempted` event, exit 83.
    The one early exit of every rank, the built-in trainer's included."""
    from regatta.launch import Launch
    from regatta.reporting import report_once
    from regatta.status import write_status

    launch = launch or Launch.from_env()
    message = f"SIGTERM during {phase}, before training started: no checkpoint taken"
    write_status(launch, EXIT_PREEMPTED, message, 0)
    report_once(launch.env(), launch.rank, "preempted", message,
                {"phase": phase, "step": 0, "checkpoint": False})
    logging.shutdown()
    os._exit(EXIT_PREEMPTED)
