"""A TRL `SFTTrainer` job made fault-tolerant by the Hugging Face
RegattaCallback, written the way a team writes an SFT script: a text
`datasets.Dataset`, a tokenizer, `SFTConfig`, `SFTTrainer(...,
callbacks=[regatta_cb])`. Everything is built locally (no hub download): a
word-level tokenizer from the `tokenizers` library, a tiny GPT-2 from a
config, and sentences where each word predicts the next.

Hyperparameters (REGATTA_CONFIG): steps, lr, sleep.
"""

import regatta.preemption

regatta.preemption.install()  # SIGTERM handled before torch loads

import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from regatta.integrations.huggingface import RegattaCallback  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    TrainerCallback,
)
from trl import SFTConfig, SFTTrainer  # noqa: E402

WORDS = [f"w{i}" for i in range(64)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[EOS]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                   unk_token="[UNK]", eos_token="[EOS]")


def sentences(n: int) -> Dataset:
    """Counting in strides: `w5 w8 w11 ...`, each word predicts the next."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        start, stride = (int(v) for v in torch.randint(0, 64, (2,), generator=g))
        rows.append(" ".join(WORDS[(start + k * (stride % 5 + 1)) % 64] for k in range(12)))
    return Dataset.from_dict({"text": rows})


class Sleep(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)  # a pace, not a wait: slow steps leave a test time to act


def main() -> None:
    hp = {"steps": 40, "lr": 1e-3, "sleep": 0.0,
          **json.loads(os.environ.get("REGATTA_CONFIG") or "{}")}
    regatta_cb = RegattaCallback()  # regatta: before the trainer
    tok = tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32,
                                       vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                       eos_token_id=tok.eos_token_id))
    config = SFTConfig(
        output_dir="sft-output", max_steps=hp["steps"], learning_rate=hp["lr"],
        per_device_train_batch_size=8, logging_steps=1, report_to=[], save_strategy="no",
        max_length=32, bf16=False, gradient_checkpointing=False,
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        disable_tqdm=True, seed=0)
    trainer = SFTTrainer(model=model, args=config, train_dataset=sentences(512),
                         processing_class=tok, callbacks=[regatta_cb, Sleep(hp["sleep"])])
    trainer.train(resume_from_checkpoint=regatta_cb.resume_from_checkpoint())  # regatta


if __name__ == "__main__":
    main()
