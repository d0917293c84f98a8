"""The batch script of an attempt: one `srun` step per node, each running
the node's launcher (the worker package's) around one torchrun.

Slurm places the job, so which host is node 0 and which port is free there
is known only inside the allocation: the node script fills torchrun's
`--node_rank`, `--master_addr` and `--master_port` in at run time. A node's
rank is its placement's (a table by Slurm node name), not Slurm's node id,
so the control plane's view of which node runs which ranks holds.

The launcher is the worker package's (regatta/node/launcher.py, run as
`python -m regatta.node.launcher` with the pool's Python): a Slurm node needs
the worker's Python, torch and the `regatta` package, not the control
plane's code. Its per-node `exit.json` and the ranks' status files are what
`observe` reads back, as on the local fleet.
"""

from __future__ import annotations

import shlex

from regatta import contract
from regatta.node import launcher

from ..base import LaunchRequest
from ..local.attempts import torchrun_argv

NODE_RANK, MASTER_ADDR, MASTER_PORT = "@NODE_RANK@", "@MASTER_ADDR@", "@MASTER_PORT@"
# A node that Slurm gave the job but that is none of its placements: the
# script refuses to run there (cannot happen with --nodelist; a guard).
NOT_PLACED_EXIT = 97
# How often each node's launcher rewrites its beat (attempts.observe reads
# a silent one as the node gone with its ranks).
BEAT_EVERY_S = 1.0
# Written in the attempt's folder when Regatta stops the attempt: the batch
# shell then holds the allocation until Regatta's scancel ends it (at most
# STOPPING_WAIT_S), so that Slurm records the job CANCELLED.
STOPPING = "stopping"
STOPPING_WAIT_S = 120
_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def _word(arg: str) -> str:
    """`arg` quoted for bash, with the placeholders left to expand."""
    quoted = "'" + arg.replace("'", "'\"'\"'") + "'"
    for placeholder, var in ((NODE_RANK, "NODE_RANK"), (MASTER_ADDR, "MASTER_ADDR"),
                             (MASTER_PORT, "MASTER_PORT")):
        quoted = quoted.replace(placeholder, f"'\"${var}\"'")
    return quoted


def node_script(attempt_dir: str, python: str, request: LaunchRequest) -> str:
    placements = sorted(request.placements, key=lambda p: p.node_rank)
    argv = torchrun_argv(python, len(placements), NODE_RANK, request.nproc_per_node,
                         MASTER_PORT, tuple(request.command), master_addr=MASTER_ADDR)
    cases = "\n".join(f"  {shlex.quote(p.node)}) NODE_RANK={p.node_rank} ;;" for p in placements)
    return f"""#!/bin/bash
# One node's part of Regatta attempt {request.name}, run by srun on every node.
case "$SLURMD_NODENAME" in
{cases}
  *) echo "regatta: $SLURMD_NODENAME is no placement of this attempt" >&2; exit {NOT_PLACED_EXIT} ;;
esac
NODE_DIR={shlex.quote(attempt_dir)}/node-$NODE_RANK
mkdir -p "$NODE_DIR/status"
export {contract.NODE}="$SLURMD_NODENAME" {contract.STATUS_DIR}="$NODE_DIR/status"
exec {shlex.join(launcher.command(python, "run"))} --foreground \\
  --beat-every {BEAT_EVERY_S:g} --dir "$NODE_DIR" -- \\
  {' '.join(_word(a) for a in argv)}
"""


def batch_script(attempt_dir: str, python: str, request: LaunchRequest) -> str:
    placements = sorted(request.placements, key=lambda p: p.node_rank)
    first = placements[0].node
    nodes = " ".join(shlex.quote(p.node) for p in placements)
    return f"""#!/bin/bash
# Regatta attempt {request.name}: one torchrun per node (docs/slurm.md).
set -u
# Node rank 0 hosts torchrun's store: its address as Slurm knows it. The port
# is picked free here, on the batch host (Slurm's first node; node rank 0's
# host unless Regatta ranked the nodes otherwise).
MASTER_ADDR=$(scontrol show node -o {shlex.quote(first)} | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
MASTER_PORT=$({shlex.quote(python)} -c {shlex.quote(_FREE_PORT)})
export MASTER_ADDR MASTER_PORT
echo "regatta: master $MASTER_ADDR:$MASTER_PORT on $SLURM_JOB_NODELIST"
# A step per node, not one step across them: a multi-node step completes
# through a tree of its nodes' slurmstepds, so a lost node would hold the
# survivors' part (and the job) until a timeout; single-node steps end alone.
pids=()
for node in {nodes}; do
  srun --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 --export=ALL \\
    bash {shlex.quote(attempt_dir)}/node.sh &
  pids+=($!)
done
status=0
for pid in "${{pids[@]}}"; do
  wait "$pid" || status=$?
done
# Stopped by Regatta (a cancel, a relaunch): its scancel ends the job.
if [ -e {shlex.quote(attempt_dir)}/{STOPPING} ]; then sleep {STOPPING_WAIT_S}; fi
exit $status
"""
