"""After the first step the SDK's own gloo groups (checkpoints, the per-step
agreement) time out as the training group does: a rank whose peer never
joins a checkpoint collective fails in collective_timeout_s, where it waited
out the start-up timeout (30 min by default) before. Two real processes, a
real gloo rendezvous: rank 1 stops taking part, rank 0 must give up."""

import os
import subprocess
import sys
import textwrap

import pytest

from .helpers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RANK = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from regatta.dist import init, tighten_timeout

    d = init(600.0)                # the start-up timeout: ten minutes
    dist.barrier()                 # both ranks are up
    tighten_timeout(2.0, d)        # as the trainer does after its first step
    if d.rank == 1:
        time.sleep(600)            # a stuck peer: never joins again
    try:
        dist.all_reduce(torch.zeros(1), group=getattr(d, sys.argv[1]))
    except Exception as exc:
        print("gave up:", type(exc).__name__, str(exc)[:200], flush=True)
        os._exit(3)
    print("joined", flush=True)
    os._exit(0)
""")


@pytest.mark.parametrize("group", ["ckpt_group", "control_group"])
def test_a_collective_on_the_sdks_groups_fails_in_the_collective_timeout(group):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, group],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    try:
        # Well inside the start-up timeout (600 s): only the tightened one
        # can end rank 0's wait.
        out, _ = ranks[0].communicate(timeout=90)
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    assert ranks[0].returncode == 3, out
    assert "gave up:" in out, out
