"""A user's training program written against the `regatta` SDK, the way
docs/sdk.md shows it: run under torchrun by the SDK tests.

Environment knobs (the test's, not the SDK's): SDK_STEPS (default 12),
SDK_SLEEP (seconds per step), SDK_MODE ("dcp": model and optimizer through
DCP, with each rank's dropout RNG as its rank_state; "stateless": the same
with no dropout and no rank_state, so a survivor can hand over with no code
of the program's; "files": a torch.save file of its own through
checkpoint_files).
Every rank prints one line per decision, so a test can see that all ranks
acted at the same step.
"""

import regatta.preemption

regatta.preemption.install()  # before torch: see regatta/preemption.py

import glob  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

import regatta  # noqa: E402
import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

STEPS = int(os.environ.get("SDK_STEPS", "12"))
SLEEP = float(os.environ.get("SDK_SLEEP", "0"))
MODE = os.environ.get("SDK_MODE", "dcp")


def say(line: str) -> None:
    # One write per line: print() writes the text and the newline apart, so
    # two ranks sharing the log could splice their lines.
    os.write(1, (line + "\n").encode())


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)  # data position = the step
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    torch.manual_seed(0)
    run = regatta.init(config={"program": "sdk_program", "steps": STEPS}, keep_last=100)
    dropout = 0.0 if MODE == "stateless" else 0.2
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(dropout),
                              torch.nn.Linear(32, 1))
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = regatta.ModelState(model, opt)
    torch.manual_seed(100 + run.rank)  # dropout differs per rank: its RNG must resume
    start = resume(run, model, opt, state)
    for step in range(start + 1, STEPS + 1):
        x, y = batch(step, run.rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(SLEEP)  # a pace, not a wait: slow steps leave a test time to act
        run.log({"loss": loss.detach(), "lr": 1e-2}, step=step)
        if run.should_checkpoint(step) and step < STEPS:
            say(f"rank {run.rank} step {step} save")
            save(run, step, state, model, emergency=False)
        if run.should_stop(step):
            say(f"rank {run.rank} step {step} stop")
            save(run, step, state, model, emergency=True)
            run.exit_preempted(step)
    save(run, STEPS, state, model, emergency=False, final=True)
    before = gloo_threads()
    run.finish(STEPS)
    # The program's own group still serves it after the run is over.
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    say(f"rank {run.rank} finished, gloo threads {before} then {gloo_threads()}, "
        f"sum {int(total.item())}")
    run_exit()


def resume(run, model, opt, state) -> int:
    if MODE == "files":
        resumed = run.resume()
        if resumed is None:
            return 0
        saved = torch.load(resumed.path / f"rank-{run.rank}.pt", weights_only=False)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        torch.set_rng_state(saved["rng"])
        return resumed.step
    resumed = run.resume(state)
    if resumed is None:
        return 0
    if MODE != "stateless":
        torch.set_rng_state(resumed.rank_state["rng"])
    return resumed.step


def save(run, step, state, model, *, emergency: bool, final: bool = False) -> None:
    if MODE == "files":
        folder = run.checkpoint_dir(step)
        torch.save({"model": model.module.state_dict(), "optim": state.optimizer.state_dict(),
                    "rng": torch.get_rng_state()}, folder / f"rank-{run.rank}.pt")
        run.checkpoint_files(step)
        return
    export = regatta.Export(model, {"layers": [16, 32, 1]}) if final else None
    rank_state = None if MODE == "stateless" else {"rng": torch.get_rng_state()}
    run.checkpoint(step, state, rank_state=rank_state, export=export)


def gloo_threads() -> int:
    """This process's gloo worker threads (two per group), by the name torch gives them."""
    names = []
    for comm in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(comm) as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return names.count("pt_gloo_runloop")


def run_exit() -> None:
    torch.distributed.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
