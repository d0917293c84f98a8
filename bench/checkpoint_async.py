"""Seconds a step is blocked by an async checkpoint vs a synchronous one, and the
DCP writer's bytes/s vs `dd` writing the same number of bytes to the same disk.

    .venv/bin/python bench/checkpoint_async.py [--layers 8 --width 512 --repeat 3]

One process (gloo, world size 1), the trainer's own Checkpointer and model.
Both dd and the DCP writer fsync (dd conv=fsync; FileSystemWriter sync_files).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from regatta.checkpoint import Checkpointer
from regatta.dist import Dist
from regatta.reporting import NullReporter
from regatta.retention import KeepLast
from regatta.state import ModelState
from regatta.storage import LocalStorage
from torch.distributed.checkpoint.state_dict import get_state_dict
from trainer.model import GPT, GPTShape


def init_single() -> Dist:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    return Dist(0, 1, 0, torch.device("cpu"), "gloo", dist.new_group(backend="gloo"),
                dist.new_group(backend="gloo"))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def dd_seconds(path: Path, nbytes: int) -> float:
    block = 4 << 20
    count = max(1, nbytes // block)
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", f"bs={block}", f"count={count}",
                    "conv=fsync"], check=True, capture_output=True)
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed * nbytes / (count * block)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = init_single()
    model = GPT(GPTShape(n_layer=args.layers, n_head=8, n_embd=args.width, block_size=128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (2, 128))
    model(x, x).backward()
    opt.step()  # the optimizer has its moments, as it would mid-run
    root = Path(tempfile.mkdtemp(prefix="regatta-bench-", dir=args.dir))
    storage = LocalStorage(root / "ckpt")
    ckpt = Checkpointer(storage, d, {"bench": True}, root / "staging", KeepLast(1),
                        reporter=NullReporter())
    state = {"step": 0}
    sync_block, async_block, async_total = [], [], []
    step = 0
    for _ in range(args.repeat):
        step += 1
        t0 = time.perf_counter()
        ckpt.save(step, ModelState(model, opt), state, use_async=False)
        sync_block.append(time.perf_counter() - t0)
        step += 1
        t0 = time.perf_counter()
        ckpt.save(step, ModelState(model, opt), state, use_async=True)
        async_block.append(time.perf_counter() - t0)
        ckpt.pending.local.result()
        ckpt.commit_pending()
        async_total.append(time.perf_counter() - t0)
    nbytes = dir_bytes(storage.local_dir(step))

    # Raw writer throughput: dcp.save alone (no hashing, no manifest) vs dd.
    writer_s, dd_s = [], []
    for i in range(args.repeat):
        target = root / f"raw-{i}"
        model_sd, optim_sd = get_state_dict(model, opt)
        t0 = time.perf_counter()
        dcp.save({"model": model_sd, "optim": optim_sd},
                 storage_writer=dcp.FileSystemWriter(str(target)))
        writer_s.append(time.perf_counter() - t0)
        raw_bytes = dir_bytes(target)
        shutil.rmtree(target)
        dd_s.append(dd_seconds(root / "dd.bin", raw_bytes))
    ckpt.close()
    shutil.rmtree(root, ignore_errors=True)

    med = statistics.median
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f}M params; checkpoint {nbytes / 1e6:.1f} MB "
          f"(model + AdamW), median of {args.repeat}")
    print(f"sync save, step blocked:   {med(sync_block):.3f} s")
    print(f"async save, step blocked:  {med(async_block):.3f} s "
          f"(save completes in the background after {med(async_total):.3f} s)")
    print(f"blocked ratio async/sync:  {med(async_block) / med(sync_block):.3f} (goal <= 0.10)")
    print(f"DCP writer:  {raw_bytes / med(writer_s) / 1e6:.0f} MB/s "
          f"({raw_bytes / 1e6:.1f} MB in {med(writer_s):.3f} s, fsync)")
    print(f"dd:          {raw_bytes / med(dd_s) / 1e6:.0f} MB/s (same bytes, bs=4M conv=fsync)")
    print(f"writer/dd ratio: {med(dd_s) / med(writer_s):.2f}")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
