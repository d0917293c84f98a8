"""Tokens/s and MFU of the trainer's model on one CUDA GPU (bf16 autocast).

    .venv/bin/python bench/trainer_mfu.py --preset small --batch 16 [--compile]
    .venv/bin/python bench/trainer_mfu.py --preset medium --batch 8 --compile

MFU = achieved model FLOP/s (6N + attention per token, `GPT.flops_per_token`)
over the GPU's dense bf16 peak from `regatta.gpu.PEAK_BF16_FLOPS`. Without a
CUDA device it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from regatta.gpu import peak_flops
from trainer.config import MODEL_PRESETS
from trainer.model import GPT, GPTShape


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small", choices=sorted(MODEL_PRESETS))
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("trainer_mfu: no CUDA device here; this benchmark needs a GPU "
              "(it was not run on this machine).", file=sys.stderr)
        sys.exit(2)

    device = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = True
    shape = GPTShape(**MODEL_PRESETS[args.preset])
    model = GPT(shape).to(device)
    flops_per_token = model.flops_per_token()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_fn = torch.compile(model) if args.compile else model
    x = torch.randint(0, 256, (args.batch, shape.block_size), device=device)
    y = torch.randint(0, 256, (args.batch, shape.block_size), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens_s = args.batch * shape.block_size * args.steps / elapsed
    peak = peak_flops(device)
    name = torch.cuda.get_device_name(device)
    print(f"{name}: preset {args.preset} ({model.num_params() / 1e6:.0f}M params), "
          f"batch {args.batch} x {shape.block_size}, bf16, compile={args.compile}")
    print(f"tokens/s: {tokens_s:,.0f}  step: {elapsed / args.steps * 1e3:.1f} ms  "
          f"peak memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if peak is None:
        print(f"MFU: unknown (no peak FLOP/s for {name!r} in regatta.gpu.PEAK_BF16_FLOPS)")
    else:
        print(f"MFU: {flops_per_token * tokens_s / peak:.1%} of {peak / 1e12:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
