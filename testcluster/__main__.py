"""`python -m testcluster VERB`: build, up, down, kubeconfig, status.

`up` starts the cluster in a state folder (default .regatta/kube, or
$REGATTA_KUBE_STATE), applies deploy/, adds a small GPU fleet and prints
the kubeconfig that acts as Regatta's ServiceAccount. `down` stops it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import build

DEFAULT_STATE = Path(os.environ.get("REGATTA_KUBE_STATE") or
                     Path(__file__).resolve().parent.parent / ".regatta" / "kube")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verb", choices=("build", "up", "down", "kubeconfig", "status"))
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE,
                        help=f"state folder (default {DEFAULT_STATE})")
    parser.add_argument("--nodes", type=int, default=4, help="kwok GPU nodes for `up`")
    parser.add_argument("--admin", action="store_true",
                        help="`kubeconfig`: the admin's instead of Regatta's")
    parser.add_argument("--background", action="store_true",
                        help="`build`: start it in a process of its own and return")
    args = parser.parse_args(argv)
    try:
        return VERBS[args.verb](args)
    except build.BuildError as exc:
        print(f"testcluster: {exc}", file=sys.stderr)
        return 2


def _build(args) -> int:
    print(build.start_in_background() if args.background else build.build())
    return 0


def _up(args) -> int:
    from . import bootstrap
    from .cluster import TestCluster
    from .fleet import Fleet, Pool

    started = time.monotonic()
    cluster = TestCluster(args.state, build.build())
    cluster.up()
    regatta = bootstrap.regatta_kubeconfig(cluster)
    pool = Pool("h100", size=args.nodes)
    Fleet(bootstrap.api_client(cluster.admin_kubeconfig)).add(pool)
    print(f"testcluster: up in {time.monotonic() - started:.1f} s, {args.nodes} kwok nodes "
          f"in pool {pool.name} (label {pool.selector})")
    print(f"  admin:   KUBECONFIG={cluster.admin_kubeconfig}")
    print(f"  Regatta: KUBECONFIG={regatta}  (ServiceAccount regatta/regatta-control-plane)")
    v = build.versions()
    print(f"  runs:    training-operator {v['training-operator']}, Trainer {v['trainer']} with "
          f"JobSet {v['jobset']}, Kueue {v['kueue']} (no queues yet: docs/kubernetes.md)")
    print(f"  logs:    {cluster.logs}/")
    print("  stop:    make kube-down")
    return 0


def _down(args) -> int:
    from .cluster import TestCluster

    TestCluster(args.state).down()
    print(f"testcluster: stopped what {args.state} ran")
    return 0


def _kubeconfig(args) -> int:
    path = args.state / ("admin.kubeconfig" if args.admin else "regatta.kubeconfig")
    if not path.exists():
        print("testcluster: no cluster there; run `make kube-up`", file=sys.stderr)
        return 1
    print(path)
    return 0


def _status(args) -> int:
    from .cluster import TestCluster

    running = TestCluster(args.state).running()
    for name, pid in running.items():
        print(f"{name}\t{pid}")
    return 0 if running else 1


VERBS = {"build": _build, "up": _up, "down": _down, "kubeconfig": _kubeconfig,
         "status": _status}

if __name__ == "__main__":
    sys.exit(main())
