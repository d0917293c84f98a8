"""What profiling on demand costs a step: the trainer's model trained for the
same number of steps unprofiled and under the SDK's profiler
(`regatta.profiling.Profiler`, as the `profile` directive runs it), in the
same run; then the time to export, gzip and write the trace, and its size.

    .venv/bin/python bench/profiling.py [--preset tiny --batch 8 --steps 10 --repeat 3]

One process, CPU (or the first CUDA GPU with --cuda, where the profiler
records CUDA activity too). The step times are medians over `--repeat`
windows of `--steps` steps each, unprofiled and profiled windows alternating.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time

import torch
from regatta.profiling import Profiler
from regatta.reporting import NullReporter
from regatta.storage import LocalStorage
from trainer.config import MODEL_PRESETS
from trainer.model import GPT, GPTShape


class Reports(NullReporter):
    def __init__(self) -> None:
        self.traces: list[dict] = []

    def profile(self, payload: dict) -> None:
        self.traces.append(payload)


def make_step(model, opt, device, batch: int, block: int):
    x = torch.randint(0, 256, (batch, block), device=device)
    y = torch.randint(0, 256, (batch, block), device=device)

    def step() -> None:
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return step


def window(step, n: int, profiler: Profiler | None, first: int) -> float:
    """Seconds per step over n steps; with a profiler, those n steps are one
    profile, driven through the boundaries as `Run` drives it."""
    if profiler is not None:
        profiler.at_boundary(first - 1, (f"bench{first}", n))
    start = time.perf_counter()
    for k in range(first, first + n):
        step()
        if profiler is not None and k < first + n - 1:
            profiler.at_boundary(k, None)
    elapsed = time.perf_counter() - start
    return elapsed / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny", choices=sorted(MODEL_PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="steps per window (one profile)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()
    if args.cuda and not torch.cuda.is_available():
        print("profiling: --cuda asked but no CUDA device here", file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    shape = GPTShape(**MODEL_PRESETS[args.preset])
    model = GPT(shape).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = make_step(model, opt, device, args.batch, shape.block_size)
    for _ in range(3):
        step()

    with tempfile.TemporaryDirectory() as tmp:
        storage, reports = LocalStorage(tmp), Reports()
        profiler = Profiler(0, device, storage, reports)
        plain, profiled, finish = [], [], []
        first = 1
        for _ in range(args.repeat):
            plain.append(window(step, args.steps, None, first))
            first += args.steps
            profiled.append(window(step, args.steps, profiler, first))
            t0 = time.perf_counter()
            profiler.at_boundary(first + args.steps - 1, None)  # the last boundary: write
            finish.append(time.perf_counter() - t0)
            first += args.steps
        trace = reports.traces[-1]
        data = (storage.root / trace["uri"].split(str(storage.root) + "/", 1)[1]).read_bytes()
        events = len(json.loads(gzip.decompress(data))["traceEvents"])

    base, prof = statistics.median(plain), statistics.median(profiled)
    print(f"{device.type}: preset {args.preset} ({model.num_params() / 1e6:.1f}M params), "
          f"batch {args.batch} x {shape.block_size}, {args.steps} steps per window, "
          f"{args.repeat} windows each")
    print(f"step unprofiled (baseline): {base * 1e3:8.1f} ms")
    print(f"step profiled:              {prof * 1e3:8.1f} ms   ({prof / base:.2f}x the baseline)")
    print(f"export + gzip + write:      {statistics.median(finish) * 1e3:8.1f} ms per rank "
          f"({statistics.median(finish) / base:.1f} baseline steps, once per profile)")
    print(f"trace: {trace['bytes'] / 1024:.0f} KiB gzipped, {events} events, "
          f"{trace['bytes'] / args.steps / 1024:.1f} KiB per step")


if __name__ == "__main__":
    main()
