"""Under torchrun: async saves whose staging raises on rank 1 (standing in for
the CUDA stager crash of issue 11). Training must go on, each failed save
must be reported and taken synchronously instead, and the rank exit 0.

    torchrun --nproc-per-node 2 failing_stager.py <checkpoint dir> <staging dir>
"""

import os
import sys
from pathlib import Path

import torch
from regatta import dist as rdist
from regatta import reporting
from regatta.checkpoint import Checkpointer
from regatta.retention import KeepLast
from regatta.state import ModelState
from regatta.storage import LocalStorage
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


class FailingStager(DefaultStager):
    def stage(self, state_dict, **kwargs):
        raise RuntimeError("cudaHostRegister: out of pinned memory (injected)")


def stagers(rank: int):
    plain = StagingOptions(False, False, False, False)
    return lambda: FailingStager(plain) if rank == 1 else DefaultStager(plain)


def main() -> int:
    d = rdist.init(60.0)
    reporter = reporting.from_env(os.environ, d.rank, 0.2)
    reporter.start()
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ckpt = Checkpointer(LocalStorage(sys.argv[1]), d, {"program": "failing_stager"},
                        Path(sys.argv[2]), KeepLast(10), reporter,
                        stager_factory=stagers(d.rank))
    for step in range(1, 5):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step in (2, 4):
            ckpt.save(step, ModelState(model, opt), {"step": step}, use_async=True)
            ckpt.commit_pending()
    print(f"rank {d.rank} trained to step {step}; async_enabled={ckpt.async_enabled}",
          flush=True)
    ckpt.close()
    reporter.close()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
