"""A PyTorch Lightning `Callback` that makes a `Trainer.fit` job
fault-tolerant under Regatta with one line:

    from regatta.integrations.lightning import RegattaCallback
    regatta_cb = RegattaCallback()
    trainer = L.Trainer(..., callbacks=[regatta_cb])
    trainer.fit(model, data, ckpt_path=regatta_cb.ckpt_path())

- `trainer.callback_metrics` (what the module `self.log`s) go to `run.log`
  from rank 0 after every training batch (every `log_every_n_steps`, the
  Trainer's own setting) and after validation;
- the job's interval (`REGATTA_CHECKPOINT_EVERY`, the control plane's auto
  interval) and "checkpoint now" directives save the Lightning checkpoint
  (`trainer.save_checkpoint`, the full `.ckpt`: weights, optimizer, loops)
  into `step-N/lightning.ckpt`, committed as a verified Regatta checkpoint;
- a stop directive, a drain or a spot notice (SIGTERM) saves at once, sets
  `trainer.should_stop` on every rank at the same step, and at the end of
  `fit` exits 83 (the control plane resumes the job);
- a run that finishes saves its last step (``save_final=True``) and reports
  `finished`;
- `ckpt_path()` is the `.ckpt` of the verified checkpoint the control plane
  chose (None to start fresh).

Works with the `lightning` package (`lightning.pytorch`) or, without it,
`pytorch_lightning`. Importing this module imports Lightning; `import
regatta` does not.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the older distribution name
    from pytorch_lightning import Callback

import regatta
import regatta.preemption

log = logging.getLogger("regatta.integrations.lightning")

__all__ = ["CKPT_NAME", "RegattaCallback"]

CKPT_NAME = "lightning.ckpt"


class RegattaCallback(Callback):
    """See the module's docstring. `run` is a `regatta.Run` of your own (or
    one is made by `regatta.init(**init_options)` when first needed; Lightning
    then joins its process group instead of making one)."""

    def __init__(self, run: Any = None, *, save_final: bool = True, exit_on_stop: bool = True,
                 **init_options: Any) -> None:
        self._run = run
        self._init_options = init_options
        self.save_final = save_final
        self.exit_on_stop = exit_on_stop
        self._resumed = False
        self._ckpt: str | None = None
        self.stopping = False
        self.last_logged = -1
        self.saved_step: int | None = None

    @property
    def run(self):
        if self._run is None:
            self._run = regatta.init(**self._init_options)
        return self._run

    def ckpt_path(self) -> str | None:
        """The `.ckpt` to pass as `trainer.fit(..., ckpt_path=...)`: from the
        verified checkpoint the control plane chose (standalone: the newest
        verified), or None. Collective: call it on every rank."""
        if not self._resumed:
            self._resumed = True
            resumed = self.run.resume()
            if resumed is not None:
                self.saved_step = resumed.step
                found = resumed.path / CKPT_NAME
                if not found.is_file():
                    found = next(iter(sorted(resumed.path.glob("*.ckpt"))), None)
                self._ckpt = str(found) if found is not None else None
        return self._ckpt

    # -- saving ------------------------------------------------------------------------
    def save(self, trainer, step: int) -> bool:
        """Save the trainer's checkpoint as step-N (collective: every rank).
        A step saved already is not written again (its files are committed)."""
        if step == self.saved_step:
            return True
        self.saved_step = step
        folder = self.run.checkpoint_dir(step)
        trainer.save_checkpoint(str(folder / CKPT_NAME))  # rank 0 writes; barriers inside
        return self.run.checkpoint_files(step)

    def _report(self, trainer, step: int) -> None:
        if trainer.global_rank != 0 or step == self.last_logged:
            return
        metrics = {k: v for k, v in trainer.callback_metrics.items()
                   if getattr(v, "numel", lambda: 1)() == 1}
        if metrics:
            self.run.log(metrics, step=step)
            self.last_logged = step

    # -- Lightning's events --------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module):
        if not self._resumed:
            found = self.ckpt_path()
            if found is not None and trainer.ckpt_path is None:
                log.warning("a verified checkpoint exists (%s) but fit() was not given it: "
                            "pass ckpt_path=callback.ckpt_path()", found)

    def on_train_start(self, trainer, pl_module):
        # Lightning's own SIGTERM handler (registered just before this hook)
        # raises SystemExit in the middle of the loop, with no checkpoint;
        # SIGTERM goes back to Regatta's: finish the step, save, exit 83.
        if threading.current_thread() is threading.main_thread():
            guard = regatta.preemption.install()
            signal.signal(signal.SIGTERM, lambda signum, frame: guard.deliver())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        self.run.status(step=step)  # every rank's heartbeat carries its step
        if step % max(1, trainer.log_every_n_steps) == 0:
            self._report(trainer, step)
        if self.run.should_checkpoint(step):
            self.save(trainer, step)
        if self.run.should_stop(step):
            self.stopping = True
            self.save(trainer, step)
            trainer.should_stop = True

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.last_logged = -1
            self._report(trainer, trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        step = trainer.global_step
        if self.stopping:
            if self.exit_on_stop:
                self.run.exit_preempted(step)
            self.run.preempted(step)
            return
        if self.save_final:
            self.save(trainer, step)
        self.run.finish(step)
