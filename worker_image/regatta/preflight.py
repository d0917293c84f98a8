"""The preflight check: a few timed all-reduces across the chosen nodes.

    torchrun --nnodes N ... -m regatta.preflight --out result.json

Started by torchrun, one process per node (the local provider's
clusters/providers/local/preflight.py launches it). It lives in the worker
package, not the control plane, because it needs torch. Each rank writes
`{"node", "seconds", "algbw_gbps", "busbw_gbps", ...}` to `--out`. A node
the operator marked bad (`REGATTA_PREFLIGHT_FAULT`) writes its error and
exits before joining, so the provider can name it without waiting for the
others' collective timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

from regatta import contract as c

EXIT_FAILED = 3


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    # Settings come from the environment too: torchrun's own parser would take
    # flags like "--node" after the script for abbreviations of its own.
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m regatta.preflight")
    # Under a launcher that gives each node a status folder (Slurm's node
    # script), the report goes there when no path is named.
    status_dir = env.get(c.STATUS_DIR)
    parser.add_argument("--out", default=env.get(c.PREFLIGHT_OUT) or (
        os.path.join(status_dir, "preflight.json") if status_dir else None))
    parser.add_argument("--node", default=env.get(c.NODE, os.uname().nodename))

    def setting(name: str) -> str:
        return env.get(name, c.LAUNCH_ENV[name].default)

    parser.add_argument("--bytes", type=int, default=int(setting(c.PREFLIGHT_BYTES)))
    parser.add_argument("--iters", type=int, default=int(setting(c.PREFLIGHT_ITERS)))
    parser.add_argument("--timeout", type=float, default=float(setting(c.PREFLIGHT_TIMEOUT_S)))
    opts = parser.parse_args(argv)
    if not opts.out:
        parser.error(f"--out or {c.PREFLIGHT_OUT} is required")

    fault = os.environ.get(c.PREFLIGHT_FAULT)
    if fault:
        _write(opts.out, {"node": opts.node, "error": fault})
        print(f"preflight: node {opts.node} failed its self-test: {fault}", file=sys.stderr)
        return EXIT_FAILED

    import torch
    import torch.distributed as dist

    world = int(os.environ[c.WORLD_SIZE])
    rank = int(os.environ[c.RANK])
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=opts.timeout))
        tensor = torch.full((opts.bytes // 4,), float(rank + 1))
        dist.all_reduce(tensor)  # warm-up, and a check that the sum is right
        expected = world * (world + 1) / 2
        if tensor[0].item() != expected or tensor[-1].item() != expected:
            raise RuntimeError(f"all-reduce returned {tensor[0].item()}, expected {expected}")
        dist.barrier()
        start = time.perf_counter()
        for _ in range(opts.iters):
            dist.all_reduce(tensor)
        seconds = (time.perf_counter() - start) / opts.iters
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - any failure is the evidence we report
        _write(opts.out, {"node": opts.node, "error": f"{type(exc).__name__}: {exc}"[:500],
                          "peer_failure": True})
        return EXIT_FAILED
    algbw = opts.bytes / seconds / 1e9
    _write(opts.out, {
        "node": opts.node, "rank": rank, "world_size": world, "seconds": round(seconds, 6),
        "algbw_gbps": round(algbw, 4), "busbw_gbps": round(algbw * 2 * (world - 1) / world, 4),
        "bytes": opts.bytes, "iters": opts.iters,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
