"""The trainer's hyperparameters: one dataclass, each field documented.

`TrainerConfig.from_dict` is the only way a config comes in (from
`REGATTA_CONFIG` or `--config-json`); it rejects unknown keys and impossible
combinations with a `ConfigError` that names them, and `check_data` rejects a
shape the corpus cannot feed on the run's ranks, so a bad job fails before
any rank touches a GPU or joins a process group (exit code 85).

Standard library only: the control plane validates a job's hyperparameters
with `TrainerConfig.from_dict` without torch installed.

The fault-injection knobs (`Faults`: a sleep per step, an error at a step)
are not training settings: tests and demos use them to make a run slow
enough to kill or to fail like a bug in user code. They live apart, under
`"faults"`; the flat keys `step_sleep_s` and `fail_at_step` are still read
into it, for jobs written before the split.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

VOCAB_SIZE = 256  # byte-level tokens: no tokenizer to ship or download

SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size")
# The mixture-of-experts knobs a preset may set (see `TrainerConfig.moe`).
MOE_KEYS = ("moe_experts", "moe_top_k", "moe_shared_experts", "moe_hidden")

# Parameter counts are for vocab 256 (untied embeddings, so they are small).
# The -moe presets scale down the routing of DeepSeek-V3 (256 routed experts,
# 8 chosen per token, plus one shared expert that every token passes: 9
# active): fine-grained experts, narrower than the dense MLP they replace.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "nano": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},  # ~0.1M, unit tests
    "tiny": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128},  # ~0.9M
    "small": {"n_layer": 10, "n_head": 16, "n_embd": 1024, "block_size": 1024},  # ~127M
    "medium": {"n_layer": 28, "n_head": 16, "n_embd": 1024, "block_size": 1024},  # ~354M
    # 8 routed experts, 2 chosen, + 1 shared: 3 of 9 active. ~0.22M, unit tests.
    "nano-moe": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "moe_experts": 8,
                 "moe_top_k": 2, "moe_shared_experts": 1, "moe_hidden": 64},
    # 16 routed, 2 chosen, + 1 shared. ~2.6M parameters, ~0.7M active a token.
    "tiny-moe": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128, "moe_experts": 16,
                 "moe_top_k": 2, "moe_shared_experts": 1, "moe_hidden": 128},
    # 64 routed, 8 chosen, + 1 shared: 9 active, as DeepSeek-V3's 9 of 257.
    # ~726M parameters, ~138M active a token.
    "small-moe": {"n_layer": 10, "n_head": 16, "n_embd": 1024, "block_size": 1024,
                  "moe_experts": 64, "moe_top_k": 8, "moe_shared_experts": 1,
                  "moe_hidden": 512},
}

STRATEGIES = ("ddp", "fsdp")
DTYPES = ("auto", "bf16", "fp32")
DATASETS = ("builtin",)
MODES = ("train", "eval")


class ConfigError(ValueError):
    """The config cannot be run; the message names the offending keys."""


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


FAULT_KEYS = ("step_sleep_s", "fail_at_step")


@dataclass(frozen=True)
class Faults:
    """Fault injection for tests and demos; both off by default."""

    step_sleep_s: float = _f(0.0, "sleep this long in every step (a slow run to kill or drain)")
    fail_at_step: int = _f(0, "raise InjectedFailure (a user-code error, exit 1) at this "
                              "step; 0 = never")

    @classmethod
    def from_dict(cls, raw: Any) -> Faults:
        if not isinstance(raw, dict):
            raise ConfigError(f"faults must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(FAULT_KEYS))
        if unknown:
            raise ConfigError(f"unknown faults keys: {', '.join(unknown)}")
        faults = cls(**{f.name: _coerce(f"faults.{f.name}", f.type, raw[f.name])
                        for f in dataclasses.fields(cls) if f.name in raw})
        if faults.step_sleep_s < 0 or faults.fail_at_step < 0:
            raise ConfigError("faults.step_sleep_s and faults.fail_at_step must not be negative")
        return faults


@dataclass(frozen=True)
class TrainerConfig:
    # Model
    model: str = _f("tiny", f"size preset: one of {', '.join(MODEL_PRESETS)}")
    n_layer: int | None = _f(None, "transformer blocks; overrides the preset")
    n_head: int | None = _f(None, "attention heads; must divide n_embd; overrides the preset")
    n_embd: int | None = _f(None, "embedding width; overrides the preset")
    block_size: int | None = _f(None, "context length in bytes; overrides the preset")
    vocab_size: int = _f(VOCAB_SIZE, "byte-level vocabulary; must be 256")
    dropout: float = _f(0.0, "dropout probability in attention and MLP outputs")
    # Mixture of experts: a -moe preset, or moe_experts on any preset
    moe_experts: int | None = _f(
        None, "routed experts in each block's feed-forward, which replace its dense MLP; "
        "0 = dense; overrides the preset")
    moe_top_k: int | None = _f(
        None, "routed experts each token goes to, within [1, moe_experts]; overrides the "
        "preset (default 2)")
    moe_shared_experts: int | None = _f(
        None, "experts every token passes through besides its routed ones; overrides the "
        "preset (default 0)")
    moe_hidden: int | None = _f(
        None, "hidden width of each expert; overrides the preset (default "
        "4 * n_embd / moe_top_k: the routed compute of a token then matches the dense MLP's)")
    moe_capacity_factor: float = _f(
        1.25, "an expert takes at most ceil(factor * tokens * moe_top_k / moe_experts) of a "
        "micro-batch's tokens on its rank; the tokens past that are dropped by it (they go on "
        "through the residual and their other experts)")
    moe_aux_loss_coef: float = _f(
        0.01, "weight of the load-balancing loss (Switch Transformer's, summed over blocks) "
        "added to the training loss; 0 turns it off")
    # Optimisation
    batch_size: int = _f(8, "sequences per micro-batch, per rank")
    grad_accum_steps: int = _f(1, "micro-batches accumulated per optimizer step")
    lr: float = _f(3e-4, "peak learning rate (AdamW)")
    min_lr_ratio: float = _f(0.1, "cosine decay floor, as a fraction of lr")
    warmup_steps: int = _f(10, "linear warm-up steps; must be below max_steps")
    max_steps: int = _f(100, "optimizer steps in the whole run")
    weight_decay: float = _f(0.1, "AdamW weight decay on matrices (not on norms/biases)")
    grad_clip: float = _f(1.0, "clip the global grad norm to this; 0 disables clipping")
    seed: int = _f(1337, "base seed; rank r seeds its RNGs with seed + r")
    # Parallelism and numerics
    strategy: str = _f("ddp", "ddp (replicate) or fsdp (torch fully_shard, per block)")
    compile: bool | None = _f(
        None, "wrap the model in torch.compile; null (default) = on CUDA only, where it "
        "pays for its compile time, off on CPU")
    dtype: str = _f(
        "auto", "auto (bf16 autocast on CUDA, fp32 on CPU), bf16 (autocast anywhere) or fp32"
    )
    collective_timeout_s: float = _f(
        600.0, "collective timeout after the first step (start-up uses startup_timeout_s)"
    )
    startup_timeout_s: float = _f(1800.0, "rendezvous and first-step collective timeout")
    # Checkpoints
    checkpoint_every_steps: int = _f(0, "periodic checkpoint interval; 0 = only the final one")
    keep_last: int = _f(
        3, "committed checkpoints rank 0 keeps when running alone (the newest is never "
        "deleted); under a control plane its retention prunes instead"
    )
    async_checkpoint: bool = _f(
        True, "periodic saves with dcp.async_save (emergency and final saves are sync)"
    )
    # Evaluation and logging
    mode: str = _f("train", "train, or eval: load the resume checkpoint, report held-out "
                            "val_loss, val_perplexity and a few samples at its step, exit "
                            "(an eval run of the control plane's, docs/evaluation.md)")
    eval_samples: int = _f(2, "eval mode: greedy samples generated from held-out prompts")
    eval_sample_tokens: int = _f(24, "eval mode: new tokens per sample")
    val_every_steps: int = _f(0, "validation loss every N steps; 0 = never")
    val_batches: int = _f(4, "held-out micro-batches per rank per validation")
    log_every_steps: int = _f(10, "log line and metric points every N steps")
    heartbeat_interval_s: float = _f(5.0, "seconds between heartbeats (every rank)")
    data: str = _f("builtin", "dataset: builtin (Shakespeare bytes shipped in the package)")
    # Fault injection (tests and demos only)
    faults: Faults = _f(Faults(), "fault injection for tests and demos: "
                                  '{"step_sleep_s": s, "fail_at_step": n}')

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainerConfig:
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, got {type(raw).__name__}")
        raw = _faults_gathered(raw)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name == "faults" and "faults" in raw:
                kwargs["faults"] = Faults.from_dict(raw["faults"])
            elif f.name in raw:
                kwargs[f.name] = _coerce(f.name, f.type, raw[f.name])
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        try:
            raw = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config is not valid JSON: {exc}") from None
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def arch(self) -> dict[str, int]:
        """The model shape: the preset with any explicit overrides applied."""
        preset = MODEL_PRESETS[self.model]
        return {key: preset[key] if getattr(self, key) is None else getattr(self, key)
                for key in SHAPE_KEYS}

    def moe(self) -> dict[str, Any] | None:
        """The experts' shape (the preset's, with any explicit overrides and
        the defaults filled in), or None for a dense model."""
        knobs = self._moe_knobs()
        if not knobs["moe_experts"]:
            return None
        top_k = 2 if knobs["moe_top_k"] is None else knobs["moe_top_k"]
        hidden = knobs["moe_hidden"]
        if hidden is None:
            hidden = max(1, 4 * self.arch()["n_embd"] // max(1, top_k))
        return {"moe_experts": knobs["moe_experts"], "moe_top_k": top_k,
                "moe_shared_experts": knobs["moe_shared_experts"] or 0, "moe_hidden": hidden,
                "moe_capacity_factor": self.moe_capacity_factor,
                "moe_aux_loss_coef": self.moe_aux_loss_coef}

    def _moe_knobs(self) -> dict[str, int | None]:
        preset = MODEL_PRESETS.get(self.model, {})
        return {key: preset.get(key) if getattr(self, key) is None else getattr(self, key)
                for key in MOE_KEYS}

    def validate(self) -> None:
        problems = (self._choice_problems() + self._range_problems()
                    + self._combination_problems() + self._shape_problems()
                    + self._moe_problems())
        if problems:
            raise ConfigError("; ".join(problems))

    def _choice_problems(self) -> list[str]:
        choices = (("model", sorted(MODEL_PRESETS)), ("strategy", list(STRATEGIES)),
                   ("dtype", list(DTYPES)), ("data", list(DATASETS)), ("mode", list(MODES)))
        problems = [f"{key}={getattr(self, key)!r} is not one of {allowed}"
                    for key, allowed in choices if getattr(self, key) not in allowed]
        if self.vocab_size != VOCAB_SIZE:
            problems.append(f"vocab_size={self.vocab_size} but tokens are bytes (256)")
        return problems

    def _range_problems(self) -> list[str]:
        positive = ("batch_size", "grad_accum_steps", "max_steps", "keep_last", "log_every_steps")
        non_negative = ("warmup_steps", "checkpoint_every_steps", "val_every_steps",
                        "val_batches", "eval_samples", "eval_sample_tokens", "weight_decay",
                        "grad_clip", "seed")
        problems = [f"{key}={getattr(self, key)} must be at least 1"
                    for key in positive if getattr(self, key) < 1]
        problems += [f"{key}={getattr(self, key)} must not be negative"
                     for key in non_negative if getattr(self, key) < 0]
        checks = (
            (self.lr > 0, f"lr={self.lr} must be positive"),
            (0 <= self.min_lr_ratio <= 1, f"min_lr_ratio={self.min_lr_ratio} must be within "
                                          "[0, 1]"),
            (0 <= self.dropout < 1, f"dropout={self.dropout} must be within [0, 1)"),
            (self.heartbeat_interval_s > 0,
             f"heartbeat_interval_s={self.heartbeat_interval_s} must be positive"),
            (self.collective_timeout_s > 0 and self.startup_timeout_s > 0,
             "collective_timeout_s and startup_timeout_s must be positive"),
        )
        return problems + [message for ok, message in checks if not ok]

    def _combination_problems(self) -> list[str]:
        problems = []
        if self.max_steps >= 1 and self.warmup_steps >= self.max_steps:
            problems.append(
                f"warmup_steps={self.warmup_steps} must be below max_steps={self.max_steps}")
        if self.mode == "eval" and self.val_batches < 1:
            problems.append("mode=eval needs val_batches >= 1")
        if self.val_every_steps > 0 and self.val_batches < 1:
            problems.append(f"val_every_steps={self.val_every_steps} needs val_batches >= 1")
        return problems

    def _shape_problems(self) -> list[str]:
        if self.model not in MODEL_PRESETS:
            return []
        shape = self.arch()
        problems = [f"{key}={value} must be at least 1" for key, value in shape.items()
                    if value < 1]
        if shape["n_head"] >= 1 and shape["n_embd"] % shape["n_head"]:
            problems.append(
                f"n_embd={shape['n_embd']} is not divisible by n_head={shape['n_head']}")
        return problems

    def _moe_problems(self) -> list[str]:
        problems = []
        if self.moe_capacity_factor <= 0:
            problems.append(f"moe_capacity_factor={self.moe_capacity_factor} must be positive")
        if self.moe_aux_loss_coef < 0:
            problems.append(f"moe_aux_loss_coef={self.moe_aux_loss_coef} must not be negative")
        if self.model not in MODEL_PRESETS:
            return problems
        knobs = self._moe_knobs()
        experts = knobs["moe_experts"] or 0
        if experts < 0:
            return problems + [f"moe_experts={experts} must not be negative"]
        if not experts:
            # An expert knob on a dense model is a mistake, not a no-op.
            return problems + [f"{key}={getattr(self, key)} needs moe_experts >= 1"
                               for key in MOE_KEYS[1:] if getattr(self, key) is not None]
        moe = self.moe() or {}
        if not 1 <= moe["moe_top_k"] <= experts:
            problems.append(f"moe_top_k={moe['moe_top_k']} must be within "
                            f"[1, moe_experts={experts}]")
        if moe["moe_shared_experts"] < 0:
            problems.append(f"moe_shared_experts={moe['moe_shared_experts']} must not be "
                            "negative")
        if moe["moe_hidden"] < 1:
            problems.append(f"moe_hidden={moe['moe_hidden']} must be at least 1")
        return problems

    def check_data(self, world_size: int, train_bytes: int, val_bytes: int) -> None:
        """Reject a shape the corpus cannot feed on `world_size` ranks.

        The same arithmetic as trainer/data.py: training deals whole windows of
        `block_size + 1` bytes round-robin, and every rank needs `batch_size`
        of them per epoch; validation gives every rank at least one window of
        the held-out split. Run before the process group exists, so a job
        that can never train fails as a config error (85).
        """
        block = self.arch()["block_size"]
        problems = []
        train_windows = max(0, (train_bytes - 1) // block)
        if train_windows // world_size < self.batch_size:
            problems.append(
                f"block_size={block} with batch_size={self.batch_size} needs "
                f"{world_size * self.batch_size} windows of training text for {world_size} "
                f"ranks, but the corpus's {train_bytes} training bytes make {train_windows}; "
                f"lower block_size or batch_size"
            )
        val_windows = max(0, (val_bytes - 1) // block)
        if self.val_every_steps > 0 and val_windows < world_size:
            problems.append(
                f"block_size={block} leaves the {val_bytes}-byte validation split "
                f"{val_windows} windows, fewer than the {world_size} ranks need "
                f"(one each); lower block_size or set val_every_steps=0"
            )
        if problems:
            raise ConfigError("; ".join(problems))


def _faults_gathered(raw: dict[str, Any]) -> dict[str, Any]:
    """The flat fault keys of older jobs moved under "faults"."""
    flat = {k: raw[k] for k in FAULT_KEYS if k in raw}
    if not flat:
        return raw
    rest = {k: v for k, v in raw.items() if k not in FAULT_KEYS}
    nested = raw.get("faults", {})
    if not isinstance(nested, dict):
        raise ConfigError(f"faults must be a JSON object, got {type(nested).__name__}")
    return {**rest, "faults": {**flat, **nested}}


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """Check a JSON value against the field's type (ints are accepted for floats)."""
    text = str(annotation)
    ok: bool
    if text.startswith("int"):
        ok = (value is None and "None" in text) or (
            isinstance(value, int) and not isinstance(value, bool)
        )
    elif text == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif text.startswith("bool"):
        ok = isinstance(value, bool) or (value is None and "None" in text)
    elif text == "str":
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{name}={value!r} has the wrong type (expected {text})")
    return value


def describe_fields() -> list[tuple[str, str, Any]]:
    """(name, help, default) for every field, the fault knobs as
    `faults.<name>`: used to render docs/trainer.md."""
    rows = [(f.name, f.metadata["help"], f.default) for f in dataclasses.fields(TrainerConfig)
            if f.name != "faults"]
    return rows + [(f"faults.{f.name}", f.metadata["help"], f.default)
                   for f in dataclasses.fields(Faults)]
