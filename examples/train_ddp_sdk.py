"""examples/train_ddp.py with the regatta SDK: the lines marked `# regatta`
are all that changed. Now the job shows live loss curves, saves verified
checkpoints (a manifest of checksums, a commit marker), resumes from the one
the control plane chose bitwise, takes a checkpoint when asked or on a drain
or spot notice (SIGTERM), and is held to heartbeat deadlines (a hang is
found in seconds, not at the end of the run).

Run alone: torchrun --nproc-per-node 2 examples/train_ddp_sdk.py --steps 50
"""

import regatta.preemption  # regatta

regatta.preemption.install()  # regatta: SIGTERM handled before torch loads

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import regatta  # noqa: E402  # regatta
import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step (demos)")
    config = json.loads(os.environ.get("REGATTA_CONFIG") or "{}")
    p.set_defaults(**{k: v for k, v in config.items() if k in ("steps", "lr", "sleep")})
    return p.parse_args()


def main() -> None:
    args = parse()
    run = regatta.init(config=vars(args))  # regatta: process group, reporting, checkpoints
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
                          if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    state = regatta.ModelState(model, opt)  # regatta
    start = r.step if (r := run.resume(state)) else 0  # regatta: the verified checkpoint
    for step in range(start + 1, args.steps + 1):
        # The batch follows the step, not one RNG stream: a run resumed at step N
        # sees the batches an uninterrupted run sees, with nothing else to restore.
        g = torch.Generator().manual_seed(step * 1000 + run.rank)
        x = torch.randn(16, 32, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
        run.log({"loss": loss.detach()}, step=step)  # regatta: live curves, never blocks
        # regatta: the job's interval, or asked for (the last step saves below)
        if run.should_checkpoint(step) and step < args.steps:
            run.checkpoint(step, state)
        if run.should_stop():  # regatta: a drain, a spot notice, a stop
            run.checkpoint(step, state)
            run.exit_preempted(step)
    run.checkpoint(args.steps, state, export=regatta.Export(model.module))  # regatta
    run.finish(args.steps)  # regatta
    # Leave the process group before the interpreter's teardown, where gloo's
    # destructors can otherwise abort a run that succeeded.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
