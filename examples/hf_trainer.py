"""A Hugging Face `Trainer` job made fault-tolerant by one callback
(regatta.integrations.huggingface.RegattaCallback): live metrics, verified
checkpoints of the Trainer's own folders, saves when the control plane asks
or on a drain/spot notice (SIGTERM, then exit 83), and resume from the
checkpoint the control plane chose. A tiny GPT-2 built from a config (no hub
download) on synthetic tokens, so it runs on CPU.

Run alone: torchrun --nproc-per-node 2 examples/hf_trainer.py
Hyperparameters (REGATTA_CONFIG, or flags): steps, lr, sleep, save_steps.
"""

import regatta.preemption

regatta.preemption.install()  # SIGTERM handled before torch loads

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from regatta.integrations.huggingface import RegattaCallback  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demos)")
    p.add_argument("--save-steps", dest="save_steps", type=int, default=0,
                   help="the Trainer's own interval (0: only Regatta's)")
    p.add_argument("--output-dir", dest="output_dir", default="hf-output")
    config = json.loads(os.environ.get("REGATTA_CONFIG") or "{}")
    p.set_defaults(**{k: v for k, v in config.items()
                      if k in ("steps", "lr", "sleep", "save_steps")})
    return p.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Synthetic sequences with structure to learn (each token predicts the next)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        start = int(torch.randint(0, 128, (1,), generator=g))
        ids = (start + torch.arange(16) * 3) % 128
        return {"input_ids": ids, "labels": ids.clone()}


class Sleep(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    args = parse()
    regatta_cb = RegattaCallback()  # regatta: before the Trainer
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                       n_positions=32))
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, learning_rate=args.lr,
        per_device_train_batch_size=8, logging_steps=1, report_to=[],
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500, save_total_limit=2,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=training_args, train_dataset=Tokens(),
                      callbacks=[regatta_cb, Sleep(args.sleep)])
    trainer.train(resume_from_checkpoint=regatta_cb.resume_from_checkpoint())  # regatta


if __name__ == "__main__":
    main()
