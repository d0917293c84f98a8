"""A pool's spares kept for Regatta in a Slurm reservation.

A spare is a node Regatta keeps idle and health-checked so that a failed
node's gang can resume at once. Left in the partition, it is just an idle
node to Slurm, which gives it to the next user's job that fits. So the
cluster pass keeps the pool's spares in a reservation of their own
(`regatta-<cluster>-<pool>-spares`, for the user Regatta launches as): only
Regatta's jobs that name it run there, which is how the join-time check of a
spare runs. A node an attempt is launched on (or a gang's preflight checks)
leaves the reservation first: it is no spare any more.

`IGNORE_JOBS`: a node that became a spare while another user's job still ran
on it joins the reservation anyway, and is Regatta's once that job ends.
"""

from __future__ import annotations

from collections.abc import Iterable

from .commands import Slurm


def name_for(cluster: str, pool: str) -> str:
    return f"regatta-{cluster}-{pool}-spares"


def reserved(slurm: Slurm, name: str) -> set[str] | None:
    """The nodes the reservation holds; None when there is no reservation."""
    found = slurm.show("reservation", name)
    if not found:
        return None
    nodes = found[0].get("Nodes", "")
    if not nodes or nodes == "(null)":
        return set()
    return set(slurm.run(["scontrol", "show", "hostnames", nodes]).split())


def hold(slurm: Slurm, name: str, nodes: Iterable[str], user: str) -> None:
    """Make the reservation hold exactly `nodes` (none: no reservation)."""
    want = set(nodes)
    have = reserved(slurm, name)
    if have == want or (have is None and not want):
        return
    if not want:
        slurm.run(["scontrol", "delete", f"ReservationName={name}"])
    elif have is None:
        slurm.run(["scontrol", "create", "reservation", f"ReservationName={name}",
                   "StartTime=now", "Duration=infinite", f"Users={user}",
                   f"Nodes={','.join(sorted(want))}", "Flags=IGNORE_JOBS"])
    else:
        slurm.run(["scontrol", "update", f"ReservationName={name}",
                   f"Nodes={','.join(sorted(want))}"])


def release(slurm: Slurm, name: str, nodes: Iterable[str], user: str) -> None:
    """Take `nodes` out of the reservation (those it holds; others are left)."""
    have = reserved(slurm, name)
    if have and have & set(nodes):
        hold(slurm, name, have - set(nodes), user)
