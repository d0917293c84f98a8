"""An FSDP training script on the regatta SDK: the model is sharded across
ranks with torch's `fully_shard` (per block, then the whole), and its state
goes through DCP sharded (each rank writes its own shards; a resume may run
at another world size). The consolidated model is gathered once, at the end,
into the final checkpoint's `export/model.pt`.

Run alone: torchrun --nproc-per-node 2 examples/train_fsdp_sdk.py --steps 40
"""

import regatta.preemption

regatta.preemption.install()  # SIGTERM handled before torch loads

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import regatta  # noqa: E402
import torch  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.ff = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                      torch.nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(torch.nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demos)")
    config = json.loads(os.environ.get("REGATTA_CONFIG") or "{}")
    p.set_defaults(**{k: v for k, v in config.items()
                      if k in ("steps", "lr", "width", "depth", "sleep")})
    return p.parse_args()


def main() -> None:
    args = parse()
    run = regatta.init(config=vars(args))
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
                          if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)  # the same full weights on every rank before sharding
    model = Net(args.width, args.depth).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = regatta.ModelState(model, opt)
    resumed = run.resume(state)  # the verified checkpoint the control plane chose, or None
    start = resumed.step if resumed else 0
    if resumed and run.rank == 0:
        print(f"resumed from step {start} ({resumed.uri})", flush=True)
    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(step * 1000 + run.rank)  # the data follows the step
        x = torch.randn(16, args.width, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True) / args.width)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
        run.log({"loss": loss.detach()}, step=step)
        if run.should_checkpoint(step) and step < args.steps:
            run.checkpoint(step, state)
        if run.should_stop():
            run.checkpoint(step, state)
            run.exit_preempted(step)
    export = regatta.Export(model, {"width": args.width, "depth": args.depth})
    run.checkpoint(args.steps, state, export=export)
    run.finish(args.steps)
    # Leave the process group before the interpreter's teardown, where gloo's
    # destructors can otherwise abort a run that succeeded.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
