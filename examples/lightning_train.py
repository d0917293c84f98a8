"""A PyTorch Lightning job made fault-tolerant by one callback
(regatta.integrations.lightning.RegattaCallback): live metrics, verified
checkpoints of the full Lightning `.ckpt`, saves when the control plane asks
or on a drain/spot notice (SIGTERM, then exit 83), and resume from the
checkpoint the control plane chose. A tiny MLP on synthetic data, on CPU.

Run alone: torchrun --nproc-per-node 2 examples/lightning_train.py
Hyperparameters (REGATTA_CONFIG, or flags): steps, lr, sleep.
"""

import regatta.preemption

regatta.preemption.install()  # SIGTERM handled before torch loads

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import lightning as L  # noqa: E402
import torch  # noqa: E402
from regatta.integrations.lightning import RegattaCallback  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demos)")
    config = json.loads(os.environ.get("REGATTA_CONFIG") or "{}")
    p.set_defaults(**{k: v for k, v in config.items() if k in ("steps", "lr", "sleep")})
    return p.parse_args()


class Regression(L.LightningModule):
    def __init__(self, lr: float, sleep: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        time.sleep(self.hparams.sleep)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 16, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                       batch_size=16)


def main() -> None:
    args = parse()
    regatta_cb = RegattaCallback(config=vars(args))  # regatta
    L.seed_everything(0, verbose=False)
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // nproc
    trainer = L.Trainer(max_steps=args.steps, accelerator="auto", devices=nproc, num_nodes=nodes,
                        strategy="ddp" if nproc * nodes > 1 else "auto",
                        callbacks=[regatta_cb], log_every_n_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Regression(args.lr, args.sleep), data(), ckpt_path=regatta_cb.ckpt_path())


if __name__ == "__main__":
    main()
