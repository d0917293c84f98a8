"""A Hugging Face `Trainer` callback (also TRL's `SFTTrainer`, a Trainer
subclass) that makes the job fault-tolerant under Regatta with one line:

    from regatta.integrations.huggingface import RegattaCallback
    regatta_cb = RegattaCallback()
    trainer = Trainer(model=..., args=..., callbacks=[regatta_cb])
    trainer.train(resume_from_checkpoint=regatta_cb.resume_from_checkpoint())

- `logs` (loss, learning rate, grad norm, eval metrics) go to `run.log` from
  rank 0; heartbeats run from `regatta.init`'s background thread;
- every save the Trainer makes (its own `save_steps`, and the ones this
  callback asks for) is committed as a verified Regatta checkpoint `step-N/`
  holding the Trainer's `checkpoint-N` folder (model, optimizer, scheduler,
  `trainer_state.json`, every rank's `rng_state_<r>.pth`);
- the job's interval (`REGATTA_CHECKPOINT_EVERY`, the control plane's auto
  interval) and "checkpoint now" directives set `control.should_save`;
- a stop directive, a drain or a spot notice (SIGTERM) saves at once, stops
  training on every rank at the same step, and at the end of `train()`
  exits 83 (the control plane resumes the job);
- a run that finishes saves its last step (``save_final=True``) and reports
  `finished`;
- `resume_from_checkpoint()` is the verified step folder the control plane
  chose (None to start fresh): the Trainer reads it like its own.

Importing this module imports transformers; `import regatta` does not.
"""

from __future__ import annotations

import logging
import numbers
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import regatta

from ._files import drop, rank_share

log = logging.getLogger("regatta.integrations.huggingface")

__all__ = ["RegattaCallback"]


class RegattaCallback(TrainerCallback):
    """See the module's docstring. `run` is a `regatta.Run` of your own (or
    one is made by `regatta.init(**init_options)` when first needed: make the
    callback before the Trainer, so the process group is Regatta's or the
    Trainer's alike)."""

    def __init__(self, run: Any = None, *, save_final: bool = True, exit_on_stop: bool = True,
                 **init_options: Any) -> None:
        if "config" in init_options:
            # The Trainer's folder has a config.json of its own (the model's),
            # which init(config=...) would overwrite in every step-N/.
            raise ValueError("RegattaCallback takes no config=: the model's config.json "
                             "is in each checkpoint already")
        self._run = run
        self._init_options = init_options
        self.save_final = save_final
        self.exit_on_stop = exit_on_stop
        self._resumed = False
        self.stopping = False
        self.last_step = 0

    # -- the run -----------------------------------------------------------------------
    @property
    def run(self):
        if self._run is None:
            self._run = regatta.init(**self._init_options)
        return self._run

    def resume_from_checkpoint(self) -> str | None:
        """The folder to pass as `trainer.train(resume_from_checkpoint=...)`:
        the verified checkpoint the control plane chose (standalone: the
        newest verified), or None. Collective: call it on every rank."""
        if self._resumed:
            return self._resume_path
        self._resumed = True
        resumed = self.run.resume()
        self._resume_path = str(resumed.path) if resumed is not None else None
        if resumed is not None:
            self.last_step = resumed.step
        return self._resume_path

    # -- the Trainer's events ------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if not self._resumed:
            found = self.resume_from_checkpoint()
            if found is not None and state.global_step == 0:
                log.warning("a verified checkpoint exists (%s) but train() was not given it: "
                            "pass resume_from_checkpoint=callback.resume_from_checkpoint()",
                            found)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            metrics = {k: v for k, v in logs.items()
                       if isinstance(v, numbers.Real) and not isinstance(v, bool)}
            if metrics:
                self.run.log(metrics, step=state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        self.run.status(step=step)  # every rank's heartbeat carries its step
        if self.run.should_checkpoint(step):
            control.should_save = True
        if self.run.should_stop(step):
            self.stopping = True
            control.should_save = True
            control.should_training_stop = True
        elif self.save_final and step >= state.max_steps > 0:
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        folder = Path(args.output_dir) / f"checkpoint-{step}"
        share = rank_share(folder, self.run.rank) if folder.is_dir() else None
        try:
            self.run.checkpoint_files(step, share)
        finally:
            if share is not None:
                drop(share)
        self.last_step = max(self.last_step, step)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        step = state.global_step
        if self.stopping:
            if self.exit_on_stop:
                self.run.exit_preempted(step)
            self.run.preempted(step)
        else:
            self.run.finish(step)
        return control
