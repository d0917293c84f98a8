"""The stateful Trainer: model, optimizer and data, on the `regatta` SDK.

Everything that talks to the control plane or touches a checkpoint goes
through the SDK's `Run` (reporting, the per-step agreement of directives and
SIGTERM, DCP saves with manifest and commit marker, resume, the exported
model): the built-in trainer is one client of the SDK, not a second
implementation of the protocol.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import math
import random
import time

import numpy as np
import torch
import torch.distributed as dist
from regatta import gpu, startup
from regatta.contract import EXIT_COLLECTIVE, EXIT_OK
from regatta.dist import classify, tighten_timeout
from regatta.run import Run
from regatta.state import Export, ModelState
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import data
from trainer.config import TrainerConfig
from trainer.model import GPT, GPTShape, param_groups
from trainer.moe import expert_metrics

log = logging.getLogger("trainer")

# Python's cyclic GC is run by hand every this many steps (see `Trainer.setup`).
GC_EVERY_STEPS = 50


class InjectedFailure(Exception):
    """Raised by `faults.fail_at_step`: stands in for a bug in the user's training code."""


class Trainer:
    def __init__(self, cfg: TrainerConfig, run: Run):
        self.cfg, self.run_, self.d = cfg, run, run.d
        self.step = 0
        self.use_cuda = self.d.device.type == "cuda"
        self.autocast_dtype = self._autocast_dtype()

    # -- set-up ---------------------------------------------------------------
    def _autocast_dtype(self):
        if self.cfg.dtype == "bf16" or (self.cfg.dtype == "auto" and self.use_cuda):
            return torch.bfloat16
        return None

    def setup(self) -> None:
        cfg, d = self.cfg, self.d
        if self.use_cuda:
            # TF32 for the matmuls autocast leaves in fp32; bf16 does the rest.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        else:
            torch.use_deterministic_algorithms(True, warn_only=True)
        # Identical init on every rank (FSDP shards the full tensors it is given).
        torch.manual_seed(cfg.seed)
        self.shape = GPTShape(vocab_size=cfg.vocab_size, dropout=cfg.dropout, **cfg.arch(),
                              **(cfg.moe() or {}))
        model = GPT(self.shape).to(d.device)
        # The unwrapped model, whose experts keep their last routing.
        self.core = model
        self.moe = bool(self.shape.moe_experts)
        self.moe_window: torch.Tensor | None = None
        self.flops_per_token = model.flops_per_token()
        self.n_params = model.num_params()
        self.model = self._wrap(model)
        # Compiled on CUDA by default: the kernels it fuses are most of the gap
        # to the bare loop there, and its compile time would dominate on CPU.
        use_compile = cfg.compile if cfg.compile is not None else self.use_cuda
        self.compiled = use_compile
        self.forward = torch.compile(self.model) if use_compile else self.model
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95),
            fused=self.use_cuda or None,
        )
        self.state = ModelState(self.model, self.optimizer)
        train, self.val_data = data.load_splits()
        self.sampler = data.ShardedSampler(train, self.shape.block_size, cfg.batch_size,
                                           d.rank, d.world_size, cfg.seed)
        self.started_at = 0
        self._mark_completed()
        self.peak_flops = gpu.peak_flops(d.device)
        # Automatic cyclic GC pauses grow with the heap and land on random
        # steps of random ranks, where every other rank then waits for the
        # straggler at the next collective; a slow decline of tokens/s over a
        # run is the usual sign. Freeze what set-up allocated (never garbage)
        # and collect the young generations at fixed steps on every rank, as
        # torchtitan does.
        gc.collect()
        gc.freeze()
        gc.disable()

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.cfg.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model
        if self.d.world_size == 1:
            # Nothing to synchronise: on one rank DDP would only add its
            # bucket copies and, under torch.compile, split the graph at every
            # bucket boundary (dynamo's DDPOptimizer), costing fusion the
            # bare loop keeps. The checkpoint is the same either way (DCP's
            # state dict names parameters without DDP's `module.`), so a run
            # resumes across world sizes.
            return model
        return DDP(model, device_ids=[self.d.local_rank] if self.use_cuda else None)

    def _seed_step_rngs(self) -> None:
        """Every random stream of the step about to run (dropout's above all)
        seeded from (seed, rank, step) alone, like the learning rate: a
        resumed run draws what the uninterrupted one would have, with no RNG
        state in the checkpoint, and a survivor can write any rank's state
        for a step (`hand_over`)."""
        key = f"{self.cfg.seed}/{self.d.rank}/{self.step}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)

    def resume(self) -> None:
        resumed = self.run_.resume(self.state, info={"params": self.n_params})
        if resumed is None:
            return
        state = resumed.rank_state
        self.step = self.started_at = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        if state.get("world_size") != self.d.world_size:
            log.warning("world size changed (%s -> %s): the data order restarts from the "
                        "seed at the next epoch", state.get("world_size"), self.d.world_size)
        self._mark_completed()

    # -- state ------------------------------------------------------------------
    def trainer_state(self, rank: int | None = None, at: dict | None = None) -> dict:
        """What a checkpoint keeps of rank `rank` (this one by default) at
        step `at` (a `completed` record; default: now). Nothing in it is
        rank-specific but the rank itself: the sampler's position is every
        rank's, the RNGs are the step's."""
        at = at or {"step": self.step, "sampler": self.sampler.state_dict()}
        return {"step": at["step"], "rank": self.d.rank if rank is None else rank,
                "world_size": self.d.world_size, "sampler": at["sampler"],
                "config": self.cfg.to_dict()}

    def _mark_completed(self) -> None:
        """Remember the step just completed (model and optimizer updated,
        the sampler at its next batch): the state a survivor hands over."""
        self.completed = {"step": self.step, "sampler": self.sampler.state_dict()}

    def hand_over(self, cause: BaseException) -> None:
        """A peer died (a collective failed). Under DDP this rank still holds
        the whole model and optimizer of the last completed step, and every
        rank's trainer state is rebuilt from the step, so it writes that
        step, with no collective, for the relaunch to resume from: at most
        the step in flight is lost (`Run.hand_over`). Not mid-update (the
        state is half a step), not for a step already saved or resumed
        from, and not under FSDP, whose shards died with their node: the
        relaunch falls back to the newest checkpoint, as the timeline says."""
        at = self.completed
        if at is None or at["step"] in (self.started_at, self.run_.ckpt.last_committed):
            return
        if self.cfg.strategy == "fsdp":
            self.run_.hand_over_impossible(at["step"], "FSDP: the dead ranks' shards are lost")
            return
        states = {r: self.trainer_state(rank=r, at=at) for r in range(self.d.world_size)}
        self.run_.hand_over(at["step"], self.state, states,
                            cause=f"{type(cause).__name__}: {cause}")

    def save(self, *, sync: bool = False, export: bool = False) -> None:
        self.run_.checkpoint(
            self.step, self.state, rank_state=self.trainer_state(),
            sync=sync or not self.cfg.async_checkpoint,
            export=Export(self.model, self.cfg.to_dict()) if export else None)

    # -- the loop ---------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """Linear warm-up then cosine decay; a pure function of the step, so
        resuming needs no scheduler state."""
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        floor = cfg.lr * cfg.min_lr_ratio
        return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))

    def _micro_sync(self, last: bool):
        if self.cfg.strategy == "fsdp":
            self.model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if last or not isinstance(self.model, DDP):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.d.device.type, dtype=self.autocast_dtype)

    def _to_device(self, x: torch.Tensor, y: torch.Tensor):
        if not self.use_cuda:
            return x, y
        # From pinned memory the copy is truly asynchronous; from pageable
        # memory `non_blocking` would quietly make the host wait for it.
        return (x.pin_memory().to(self.d.device, non_blocking=True),
                y.pin_memory().to(self.d.device, non_blocking=True))

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, faults = self.cfg, self.cfg.faults
        if faults.fail_at_step and self.step + 1 == faults.fail_at_step:
            raise InjectedFailure(f"fail_at_step={faults.fail_at_step}: simulated user-code "
                                  "error")
        self._seed_step_rngs()
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.d.device)
        routing = None
        for micro in range(cfg.grad_accum_steps):
            x, y = self._to_device(*self.sampler.next_batch())
            with self._micro_sync(micro == cfg.grad_accum_steps - 1), self._autocast():
                loss = self.forward(x, y) / cfg.grad_accum_steps
            loss.backward()
            total += loss.detach()
            if self.moe:
                routing = self._routing(routing)
        if self.moe:
            # Device tensors only: the host reads them on log steps.
            self.moe_window = routing / cfg.grad_accum_steps
            total = self.moe_window[0]
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.completed = None  # from here to the step's end, half a step
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._mark_completed()
        if faults.step_sleep_s:
            time.sleep(faults.step_sleep_s)
        return total, norm

    def _routing(self, so_far: torch.Tensor | None) -> torch.Tensor:
        """The micro-batch's language-model loss (the reported loss, without
        the balance term) and expert routing, added to the step's sum."""
        stats = torch.cat([self.core.lm_loss.reshape(1), self.core.moe_stats()])
        return stats if so_far is None else so_far + stats

    def run(self) -> int:
        try:
            return self._train()
        except BaseException as exc:
            if classify(exc) == EXIT_COLLECTIVE:
                self.hand_over(exc)
            raise

    def _train(self) -> int:
        cfg, d = self.cfg, self.d
        tokens_per_step = cfg.batch_size * cfg.grad_accum_steps * d.world_size \
            * self.shape.block_size
        window_start, window_steps = time.perf_counter(), 0
        log.info("training %s (%d params, %s, %s) from step %d to %d on %d ranks",
                 cfg.model, self.n_params, cfg.strategy, d.backend, self.step, cfg.max_steps,
                 d.world_size)
        first = True
        if self.compiled and self.step < cfg.max_steps:
            # torch.compile compiles in the first step: seconds to minutes
            # with no step to show (regatta/startup.py).
            startup.mark("compiling")
        while self.step < cfg.max_steps:
            loss, norm = self.train_step()
            window_steps += 1
            self.run_.status(step=self.step)
            if first:
                tighten_timeout(cfg.collective_timeout_s, d)
                first = False
            if self.step % cfg.log_every_steps == 0 or self.step == cfg.max_steps:
                # The host runs ahead of the GPU, so one step's wall time says
                # little; a window's average, read where the log synchronises
                # anyway (loss.item()), is the true rate.
                self._log_metrics(loss, norm, window_steps, window_start, tokens_per_step)
                window_start, window_steps = time.perf_counter(), 0
            if self.step % GC_EVERY_STEPS == 0:
                gc.collect(1)
            code = self._boundary()
            if code is not None:
                return code
        return self._finish()

    def _boundary(self) -> int | None:
        save_now = self.run_.should_checkpoint(self.step)
        if self.run_.should_stop(self.step):
            return self._emergency_stop()
        if self.step >= self.cfg.max_steps:
            return None  # the final save is _finish's
        if save_now:
            self.save()
        if self.cfg.val_every_steps and self.step % self.cfg.val_every_steps == 0:
            self.validate()
        return None

    def _emergency_stop(self) -> int:
        if self.step >= self.cfg.max_steps:
            # Asked to stop at the last step: the run is done, and its final
            # checkpoint is the one a finish takes, with its export/ (the
            # model every succeeded job is exported as), not an emergency one.
            log.warning("asked to stop at the last step %d: finishing", self.step)
            return self._finish()
        log.warning("stopping at step %d: emergency checkpoint", self.step)
        self.run_.settle()
        if self.run_.ckpt.last_committed != self.step:
            self.save(sync=True)
        return self.run_.preempted(self.step)

    def _finish(self) -> int:
        self.run_.settle()
        # The final checkpoint carries the consolidated model (export/), which
        # the control plane copies to its registry without torch.
        self.save(sync=True, export=True)
        if self.cfg.val_every_steps:
            self.validate()
        self.run_.finish(self.step)
        log.info("finished at step %d", self.step)
        return EXIT_OK

    @torch.no_grad()
    def validate(self, pause_s: float = 0.0) -> float:
        self.model.eval()
        total = torch.zeros((), device=self.d.device)
        batches = data.val_batches(self.val_data, self.shape.block_size, self.cfg.batch_size,
                                   self.d.rank, self.d.world_size, self.cfg.val_batches)
        for x, y in batches:
            with self._autocast():
                total += self.forward(x.to(self.d.device), y.to(self.d.device)).float()
            if pause_s:
                time.sleep(pause_s)
        dist.all_reduce(total)
        self.model.train()
        val = total.item() / (self.cfg.val_batches * self.d.world_size)
        if self.d.rank == 0:
            log.info("step %d val_loss %.4f", self.step, val)
            self.run_.log({"val_loss": val}, step=self.step)
        return val

    # -- eval mode ------------------------------------------------------------------
    def evaluate_checkpoint(self) -> int:
        """Eval mode (an eval run of the control plane's): the resumed
        checkpoint's held-out loss and perplexity and a few greedy samples,
        reported at the checkpoint's step; nothing is trained or saved. A
        checkpoint other than the one asked for (the SDK falls back to an
        older good one when the named one fails verification) is an error:
        its loss would be charted at the wrong step."""
        asked = self.run_.launch.resume_step
        if self.step == 0 or (asked.isdigit() and int(asked) != self.step):
            raise RuntimeError(f"eval mode: asked to evaluate step {asked}, but loaded "
                               f"{self.step or 'no checkpoint'}")
        # A heartbeat with the step tells the control plane the run is up.
        self.run_.status(step=self.step)
        # The faults' step sleep slows each held-out batch as it slows a
        # training step: a test or demo has time to kill the eval run.
        val = self.validate(pause_s=self.cfg.faults.step_sleep_s)
        # exp of a huge loss overflows; a perplexity past e^50 says as much.
        perplexity = math.exp(min(val, 50.0))
        samples = self.generate_samples()
        if self.d.rank == 0:
            self.run_.log({"val_perplexity": perplexity}, step=self.step)
            self.run_.event("evaluated", f"step {self.step}: val_loss {val:.4f}, "
                            f"perplexity {perplexity:.2f}", step=self.step, val_loss=val,
                            val_perplexity=perplexity, samples=samples)
        self.run_.finish(self.step)
        return EXIT_OK

    @torch.no_grad()
    def generate_samples(self) -> list[dict[str, str]]:
        """Greedy continuations of the first held-out windows. Every rank
        runs the same steps (FSDP's forward is collective); rank 0 reports."""
        cfg, block = self.cfg, self.shape.block_size
        prompt_len = max(1, min(32, block // 2))
        self.model.eval()
        samples = []
        for i in range(cfg.eval_samples):
            start = i * block
            if start + prompt_len > len(self.val_data):
                break
            idx = self.val_data[start:start + prompt_len].long().unsqueeze(0).to(self.d.device)
            prompt = idx.clone()
            for _ in range(cfg.eval_sample_tokens):
                with self._autocast():
                    logits = self.forward(idx[:, -block:])
                idx = torch.cat([idx, logits[:, -1, :].argmax(dim=-1, keepdim=True)], dim=1)
            samples.append({"prompt": _text(prompt[0]), "completion": _text(idx[0, prompt_len:])})
        self.model.train()
        return samples

    def _routing_points(self) -> dict[str, float]:
        """The last step's expert load, averaged over ranks (every rank joins)."""
        if not self.moe:
            return {}
        window = self.moe_window.detach().clone()
        dist.all_reduce(window)
        stats = (window / self.d.world_size).tolist()
        return expert_metrics(stats[1:], self.shape.n_layer, self.shape.moe_experts)

    def _log_metrics(self, loss, norm, window_steps: int, window_start: float,
                     tokens_per_step: int) -> None:
        loss = loss.detach().clone()
        dist.all_reduce(loss)
        loss_v = loss.item() / self.d.world_size  # the one host sync, on log steps only
        routing = self._routing_points()
        step_time = (time.perf_counter() - window_start) / window_steps
        tokens_s = tokens_per_step / step_time
        self.run_.status(
            step_time_s=round(step_time, 5),
            samples_per_s=round(tokens_s / self.shape.block_size / self.d.world_size, 2),
            tokens_per_s=round(tokens_s / self.d.world_size, 1))
        if self.d.rank != 0:
            return
        points = {"loss": loss_v, "lr": self.lr_at(self.step - 1), "grad_norm": float(norm),
                  "tokens_per_s": tokens_s, "step_time_s": step_time,
                  "samples_per_s": tokens_s / self.shape.block_size}
        if self.peak_flops:
            points["mfu"] = self.flops_per_token * tokens_s / (self.peak_flops * self.d.world_size)
        points.update(routing)
        self.run_.log(points, step=self.step)
        # cpu is this process's CPU seconds so far: benches compare it, as it is
        # immune to other load on the machine.
        log.info("step %d loss %.4f lr %.2e grad_norm %.3f %.0f tok/s %.3fs/step cpu %.3fs",
                 self.step, loss_v, points["lr"], points["grad_norm"], tokens_s, step_time,
                 time.process_time())


def _text(tokens: torch.Tensor) -> str:
    """Byte tokens as text; a byte cut mid-character shows as U+FFFD."""
    return bytes(tokens.tolist()).decode("utf-8", errors="replace")
