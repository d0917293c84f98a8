"""A plain PyTorch DDP training script, the kind teams run today, with no
Regatta code in it: torchrun gives it RANK/WORLD_SIZE/MASTER_ADDR, it trains,
saves `ckpt-N.pt` files now and then, and exits 0.

Under Regatta (a job with `"entrypoint": ["/path/to/train_ddp.py"]`) it
finishes when every rank exits 0, and it is relaunched on healthy nodes when
one fails. It picks up its own newest `ckpt-N.pt` from the folder Regatta
names in REGATTA_CHECKPOINT_URI (a plain folder here; the SDK version,
train_ddp_sdk.py, gets verified checkpoints and live charts instead).

Run alone: torchrun --nproc-per-node 2 examples/train_ddp.py --steps 50
"""

import argparse
import glob
import json
import os
import re
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demos)")
    # Hyperparameters may also come as JSON in REGATTA_CONFIG (the job's own).
    config = json.loads(os.environ.get("REGATTA_CONFIG") or "{}")
    p.set_defaults(**{k.replace("-", "_"): v for k, v in config.items()
                      if k in ("steps", "lr", "save_every", "sleep")})
    return p.parse_args()


def newest(folder: str) -> tuple[int, str | None]:
    found = [(int(m.group(1)), path) for path in glob.glob(os.path.join(folder, "ckpt-*.pt"))
             if (m := re.search(r"ckpt-(\d+)\.pt$", path))]
    return max(found) if found else (0, None)


def main() -> None:
    args = parse()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
                          if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    folder = os.environ.get("REGATTA_CHECKPOINT_URI", "checkpoints")
    os.makedirs(folder, exist_ok=True)
    start, path = newest(folder)
    if path:
        saved = torch.load(path, map_location=device)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        if rank == 0:
            print(f"resumed from {path}", flush=True)
    for step in range(start + 1, args.steps + 1):
        # The batch follows the step, not one RNG stream: a run resumed at step N
        # sees the batches an uninterrupted run sees, with nothing else to restore.
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(16, 32, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.save_every == 0 and rank == 0:
            tmp = os.path.join(folder, f".ckpt-{step}.pt.tmp")
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, tmp)
            os.replace(tmp, os.path.join(folder, f"ckpt-{step}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
