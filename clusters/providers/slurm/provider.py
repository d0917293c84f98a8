"""The Slurm provider: a partition as the fleet, one `sbatch` per attempt
(docs/slurm.md).

Slurm owns the machines and places jobs on the nodes Regatta names
(`--nodelist`); Regatta owns health, spares, relaunches and evidence. A pool
is a partition, narrowed to a node feature when the pool sets one. Nodes are
never created here: `provision_node` says so, and `replace` retires a node by
draining it with a reason that says why. It has no health signals of its
own (no ReportsHealth, capabilities.py): a node Slurm calls down is listed
not ready, and fails once that outlasts the cluster's grace, so a slurmctld
restart (UNKNOWN for a moment) is no loss.
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings as django_settings

from controlplane.lib.errors import PermanentError
from controlplane.lib.typed_settings import setting

from ..base import (
    AttemptStatus,
    LaunchRequest,
    NodeInfo,
    Placement,
    PoolInfo,
    PreflightResult,
    preflight_evidence,
)
from . import attempts, preflight, reservation
from .commands import Slurm
from .nodes import REASON_PREFIX, UNSCHEDULABLE, admin_hold, in_pool, node_info, state_words


@dataclass(frozen=True)
class SlurmSettings:
    """A Slurm cluster's own settings (docs/slurm.md)."""

    slurm_conf: str = setting("", "slurm.conf of the cluster (default: SLURM_CONF, then "
                              "/etc/slurm/slurm.conf)")
    partition: str = setting("", "partition of the pools that name none")
    shared_dir: str = setting("", "folder every Slurm node sees at the same path, for the "
                              "attempts' scripts and exit records (default: "
                              "<REGATTA_STATE_DIR>/slurm-attempts/<cluster>, one machine only)")
    python: str = setting("", "interpreter with torch on the nodes (default: this one)")
    preflight_mode: str = setting("allreduce", "allreduce (a timed all-reduce across the "
                                  "chosen nodes, as a Slurm job) or state (Slurm's node "
                                  "state only)", choices=("allreduce", "state"))
    reserve_spares: bool = setting(True, "keep each pool's spares in a Slurm reservation of "
                                   "their own (regatta-<cluster>-<pool>-spares) so that other "
                                   "users' jobs cannot take them; the launch user must be a "
                                   "Slurm operator")
    node_silence_s: float = setting(3.0, "seconds a node's launcher may go without its beat, "
                                    "once a peer's part failed, before the node counts as lost "
                                    "(Slurm's own DOWN waits for SlurmdTimeout); under the "
                                    "cluster's root_cause_grace_s, so the job's pass knows the "
                                    "cause before it gives up waiting", minimum=2.0)


@dataclass(frozen=True)
class SlurmPoolSettings:
    partition: str = setting("", "the pool's partition (default: the cluster's)")
    feature: str = setting("", "a node feature the pool's nodes carry (sbatch --constraint)")


class SlurmProvider:
    kind = "slurm"
    Settings = SlurmSettings
    PoolSettings = SlurmPoolSettings

    def __init__(self, cluster: str, settings: SlurmSettings, slurm: Slurm | None = None):
        self.cluster = cluster
        self.settings = settings
        self.slurm = slurm or Slurm(settings.slurm_conf)
        base = settings.shared_dir or Path(django_settings.STATE_DIR) / "slurm-attempts" / cluster
        self.shared = Path(base).resolve()
        self.python = settings.python or sys.executable
        self.user = pwd.getpwuid(os.getuid()).pw_name  # whom jobs and reservations run as

    @classmethod
    def for_cluster(cls, name: str, settings: SlurmSettings) -> SlurmProvider:
        return cls(name, settings)

    # --- nodes ------------------------------------------------------------
    def _where(self, pool: PoolInfo) -> tuple[str, str]:
        own = pool.settings if isinstance(pool.settings, SlurmPoolSettings) else None
        partition = (own.partition if own else "") or self.settings.partition
        if not partition:
            raise PermanentError(f"{self.cluster}/{pool.name}: no Slurm partition; set the "
                                 "pool's or the cluster's `partition`")
        return partition, own.feature if own else ""

    def _records(self, pool: PoolInfo) -> list[dict]:
        partition, feature = self._where(pool)
        return [r for r in self.slurm.show("node") if in_pool(r, partition, feature)]

    def _record(self, pool: PoolInfo, node: str) -> dict:
        found = [r for r in self._records(pool) if r["NodeName"] == node]
        if not found:
            raise PermanentError(f"{self.cluster}/{pool.name}: no Slurm node {node!r} in "
                                 f"partition {self._where(pool)[0]}")
        return found[0]

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        return [node_info(r, pool.name) for r in self._records(pool)]

    def provision_node(self, pool: PoolInfo, name: str = "") -> NodeInfo:
        raise PermanentError(f"{self.cluster}/{pool.name}: Slurm's nodes come from its "
                             f"slurm.conf; add nodes to partition {self._where(pool)[0]}")

    def _update(self, node: str, state: str, reason: str = "") -> None:
        argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
        self.slurm.run([*argv, f"reason={reason}"] if reason else argv)

    def cordon(self, pool: PoolInfo, node: str) -> None:
        rec = self._record(pool, node)
        if state_words(rec.get("State", "")) & {"DRAIN", "DRAINED", "DRAINING"}:
            return  # drained already, by us or an operator: keep that reason
        self._update(node, "drain", f"{REASON_PREFIX}cordoned")

    def uncordon(self, pool: PoolInfo, node: str) -> None:
        rec = self._record(pool, node)
        if state_words(rec.get("State", "")) & {"DRAIN", "DRAINED", "DRAINING", "DOWN"}:
            self._update(node, "resume")

    def drain(self, pool: PoolInfo, node: str, grace_s: float = 60.0) -> None:
        """Drain the node in Slurm and SIGTERM Regatta's jobs on it: the
        trainer takes an emergency checkpoint and exits 83; the job's stop
        then ends what is left."""
        self.cordon(pool, node)
        listed = self.slurm.run(["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%i %k"])
        for line in listed.splitlines():
            job_id, _, note = line.partition(" ")
            if note.strip() == attempts.comment(self.cluster):
                attempts.scancel(self.slurm, "--signal=TERM", job_id)

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        """Slurm brings up no machine for us: the node is left drained with
        the reason, for its owners to mend and resume."""
        rec = self._record(pool, node)
        if admin_hold(rec):
            return None  # drained by its admin already: their reason stays
        if not (rec.get("Reason") or "").startswith(f"{REASON_PREFIX}replaced"):
            self._update(node, "drain", f"{REASON_PREFIX}replaced")
        return None

    # --- attempts ---------------------------------------------------------
    def launch(self, request: LaunchRequest) -> dict:
        partition, feature = self._where(request.pool)
        self._unreserve(request.pool, [p.node for p in request.placements])
        return attempts.launch(self.slurm, self.shared, self.cluster, partition, feature,
                               request, self.python)

    def observe(self, ref: dict) -> AttemptStatus:
        return attempts.observe(self.slurm, ref, self.settings.node_silence_s)

    def stop(self, ref: dict, grace_s: float = 30.0) -> None:
        attempts.stop(self.slurm, ref, grace_s, self.settings.node_silence_s)

    def preflight(self, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float = 60.0) -> PreflightResult:
        """Slurm's own view of the chosen nodes first (up, not drained), then
        (`preflight_mode: allreduce`) a timed all-reduce across them, run as
        a Slurm job of its own on exactly those nodes (preflight.py)."""
        state = self._state_check(pool, placements)
        if not state.ok or self.settings.preflight_mode != "allreduce":
            return state
        partition, feature = self._where(pool)
        return preflight.run(self.slurm, self.shared, self.cluster, partition, feature, pool,
                             placements, timeout_s, self.python,
                             self._spares_checked_in(pool, [p.node for p in placements]))

    def _state_check(self, pool: PoolInfo, placements: tuple[Placement, ...]
                     ) -> PreflightResult:
        records = {r["NodeName"]: r for r in self._records(pool)}
        per_node, failed = {}, []
        ours = None
        for p in placements:
            info = node_info(records[p.node], pool.name) if p.node in records else None
            ok = info is not None and info.ready and not info.unschedulable
            if info is not None and info.ready and state_words(
                    info.conditions["State"]) & UNSCHEDULABLE == {"RESERVED"}:
                # Slurm flags a node RESERVED once a reservation holding it
                # is active: the pool's own spare reservation is no reason
                # against a spare (another's reservation is).
                if ours is None:
                    name = self._reservation(pool)
                    ours = (reservation.reserved(self.slurm, name) or set()) if name else set()
                ok = p.node in ours
            per_node[p.node] = {"ok": ok} if ok else {
                "ok": False, "check": "slurm-state",
                "error": f"Slurm state {info.conditions['State']}: {info.conditions['Reason']}"
                if info else "not in the pool's partition"}
            if not ok:
                failed.append(p.node)
        return PreflightResult(
            ok=not failed, failed_nodes=tuple(failed),
            evidence=preflight_evidence(per_node, seconds=0.0, method="slurm-state"),
            message=f"Slurm state check failed on {', '.join(failed)}" if failed
            else f"{len(placements)} nodes up and not drained in Slurm")

    # --- spares ------------------------------------------------------------
    def _reservation(self, pool: PoolInfo) -> str:
        return reservation.name_for(self.cluster, pool.name) if self.settings.reserve_spares \
            else ""

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        """Keep exactly `nodes`, the pool's spares, in its reservation."""
        name = self._reservation(pool)
        if name:
            reservation.hold(self.slurm, name, nodes, self.user)

    def _unreserve(self, pool: PoolInfo, nodes: list[str]) -> None:
        """Nodes an attempt runs on are no spares: out of the reservation
        first, or Slurm would hold the attempt back for it."""
        name = self._reservation(pool)
        if name:
            reservation.release(self.slurm, name, nodes, self.user)

    def _spares_checked_in(self, pool: PoolInfo, nodes: list[str]) -> str:
        """The reservation a preflight of `nodes` runs in: the spares'
        own when it checks reserved spares alone (a spare's join-time
        check), none when it checks a gang about to launch (its nodes
        leave the reservation, as the launch's would)."""
        name = self._reservation(pool)
        if not name:
            return ""
        if set(nodes) <= (reservation.reserved(self.slurm, name) or set()):
            return name
        self._unreserve(pool, nodes)
        return ""
