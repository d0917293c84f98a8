"""`python -m slurmcluster VERB`: up, down, status, env, lose NODE.

`up` starts munged, the accounting (MariaDB, slurmdbd), slurmctld and the
slurmds in a state folder (default .regatta/slurm, or $REGATTA_SLURM_STATE)
and prints the SLURM_CONF that points Slurm's commands (and a Regatta
cluster's `slurm_conf`) at it. `lose n2` kills node n2 as a machine that
lost power: its slurmd and every job process on it, SIGKILLed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .cluster import SlurmCluster, SlurmClusterError, why_unavailable

DEFAULT_STATE = Path(os.environ.get("REGATTA_SLURM_STATE") or
                     Path(__file__).resolve().parent.parent / ".regatta" / "slurm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verb", choices=("up", "down", "status", "env", "lose"))
    parser.add_argument("node", nargs="?", help="the node `lose` kills (n1, n2, ...)")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE,
                        help=f"state folder (default {DEFAULT_STATE})")
    parser.add_argument("--nodes", type=int, default=4, help="nodes of partition gpu")
    parser.add_argument("--spares", type=int, default=2, help="nodes of partition spare")
    args = parser.parse_args(argv)
    cluster = SlurmCluster(args.state)
    if args.verb == "up":
        reason = why_unavailable()
        if reason:
            print(f"slurmcluster: {reason}", file=sys.stderr)
            return 2
        try:
            cluster.up(working=args.nodes, spares=args.spares)
        except SlurmClusterError as exc:
            print(f"slurmcluster: {exc}", file=sys.stderr)
            return 1
        print(f"  try:  SLURM_CONF={cluster.conf} sinfo")
        print(f"  logs: {cluster.log_dir}/")
        print("  stop: make slurm-down")
        return 0
    if args.verb == "down":
        cluster.down()
        print(f"slurmcluster: stopped what {args.state} ran")
        return 0
    if args.verb == "lose":
        if f"slurmd-{args.node}" not in cluster.running():
            print(f"slurmcluster: no slurmd of node {args.node!r} runs here", file=sys.stderr)
            return 1
        slurmd, *killed = cluster.lose_node(args.node)
        print(f"slurmcluster: node {args.node} lost: slurmd {slurmd} and {len(killed)} job "
              "processes SIGKILLed; Slurm calls it DOWN after SlurmdTimeout (10 s)")
        return 0
    if args.verb == "env":
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    running = cluster.running()
    for name, pid in running.items():
        print(f"{name}\t{pid}")
    return 0 if running else 1


if __name__ == "__main__":
    sys.exit(main())
