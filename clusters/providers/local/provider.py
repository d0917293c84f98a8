"""The local provider: logical nodes on this machine, one detached torchrun per
node of an attempt, state in `<LOCAL_FLEET_DIR>/<cluster>/` (docs/fleet.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings as django_settings
from regatta.node import launcher, procs, standby

from controlplane.lib.errors import PermanentError
from controlplane.lib.typed_settings import setting

from ..base import (
    AttemptStatus,
    FaultKind,
    HealthSignal,
    LaunchRequest,
    NodeInfo,
    Placement,
    PoolInfo,
    PreflightResult,
    RankActivity,
)
from . import attempts, devices, faults, preflight, startup, worker_env
from .book import NodeBook


def _module_names(value):
    """`standby_imports`: each a module's dotted name, said at once rather
    than left to fail quietly in the standby."""
    if isinstance(value, list):
        bad = [v for v in value
               if not isinstance(v, str) or not all(p.isidentifier() for p in v.split("."))]
        if bad:
            raise ValueError(f"must name Python modules (e.g. \"transformers.trainer\"), "
                             f"not {bad[0]!r}")
    return value


@dataclass(frozen=True)
class LocalSettings:
    """A local cluster's own settings."""

    fleet_dir: str = setting("", "state folder of the logical nodes (default: "
                             "REGATTA_LOCAL_FLEET_DIR)")
    python: str = setting("", "interpreter that runs torchrun (default: this one)")
    standbys: bool = setting(True, "keep a warm standby (Python started, torch and the "
                             "trainer imported) on every spare and gang node, so a "
                             "relaunch starts without a cold start (regatta.node.standby)")
    standby_imports: tuple[str, ...] = setting((), "further modules each standby imports ahead, "
                                         "e.g. [\"transformers.trainer\", \"lightning\"]: the "
                                         "ranks of programs that use them start warm too. "
                                         "Imported in the node's environment: a launch "
                                         "that sets other variables of its own goes cold",
                                         normalize=_module_names)


@dataclass(frozen=True)
class LocalPoolSettings:
    """A local pool's own settings."""

    devices: str = setting(devices.CPU, "cpu: its ranks see no GPU and train on gloo; "
                           "cuda: each node holds gpus_per_node of this machine's GPUs "
                           "(CUDA_VISIBLE_DEVICES) and its ranks use NCCL (devices.py)",
                           choices=devices.DEVICES)
    standbys: bool | None = setting(None, "warm standbys on this pool's nodes: false launches "
                                    "them cold, true keeps standbys; default: the cluster's "
                                    "`standbys`")


class LocalProvider:
    kind = "local"
    Settings = LocalSettings
    PoolSettings = LocalPoolSettings

    def __init__(self, cluster: str, root: Path, python: str = sys.executable,
                 standbys: bool = False, standby_imports: tuple[str, ...] = ()):
        self.cluster = cluster
        self.root = Path(root).resolve()
        self.python = python
        self.standbys = standbys
        self.standby_imports = tuple(standby_imports)
        self.book = NodeBook(self.root)

    @classmethod
    def for_cluster(cls, name: str, settings: LocalSettings) -> LocalProvider:
        base = settings.fleet_dir or django_settings.LOCAL_FLEET_DIR
        return cls(name, Path(base) / name, python=settings.python or sys.executable,
                   standbys=settings.standbys, standby_imports=settings.standby_imports)

    # --- nodes ------------------------------------------------------------
    def _info(self, pool: PoolInfo, node: dict) -> NodeInfo:
        ready = not node["down"]
        return NodeInfo(
            name=node["name"], provider_id=node["provider_id"], address="127.0.0.1",
            gpus=pool.gpus_per_node, ready=ready, unschedulable=node["unschedulable"],
            labels={"regatta/pool": pool.name, "regatta/provider": "local",
                    **({"regatta/gpus": ",".join(node["gpus"])} if node.get("gpus") else {})},
            conditions={"Ready": "True" if ready else "False"},
        )

    def _node(self, data: dict, pool: PoolInfo, name: str) -> dict:
        node = NodeBook.pool(data, pool.name)["nodes"].get(name)
        if node is None or node["retired"]:
            raise PermanentError(f"{self.cluster}/{pool.name}: no node {name!r}")
        return node

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        with self.book.edit() as data:
            entry = NodeBook.pool(data, pool.name)
            if not entry["nodes"]:
                for _ in range(pool.size + pool.spare_count):
                    NodeBook.new_node(data, self.cluster, pool.name)
            nodes = [n for n in entry["nodes"].values() if not n["retired"]]
        return [self._info(pool, n) for n in sorted(nodes, key=lambda n: n["created_at"])]

    def provision_node(self, pool: PoolInfo, name: str = "") -> NodeInfo:
        with self.book.edit() as data:
            existing = NodeBook.pool(data, pool.name)["nodes"].get(name) if name else None
            if existing and existing["retired"]:
                raise PermanentError(f"node name {name!r} belonged to a retired node")
            node = existing or NodeBook.new_node(data, self.cluster, pool.name, name)
        return self._info(pool, node)

    def cordon(self, pool: PoolInfo, node: str) -> None:
        with self.book.edit() as data:
            self._node(data, pool, node)["unschedulable"] = True

    def uncordon(self, pool: PoolInfo, node: str) -> None:
        with self.book.edit() as data:
            self._node(data, pool, node)["unschedulable"] = False

    def drain(self, pool: PoolInfo, node: str, grace_s: float = 60.0) -> None:
        """Cordon, SIGTERM the node's ranks (the trainer checkpoints and exits 83),
        and leave a detached killer to SIGKILL what still runs after grace."""
        self.cordon(pool, node)
        ranks = procs.top_ranks(procs.scan(fleet=str(self.root), node=node))
        if not ranks:
            return
        procs.send(ranks, signal.SIGTERM)
        with open(self.root / "killer.err", "ab") as err:
            subprocess.Popen(
                launcher.command(self.python, "kill-after", "--seconds", str(grace_s),
                                 "--fleet", str(self.root), "--node", node),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True,
            ).wait(timeout=15)

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        with self.book.edit() as data:
            old = NodeBook.pool(data, pool.name)["nodes"].get(node)
            if old is None:
                raise PermanentError(f"{self.cluster}/{pool.name}: no node {node!r}")
            if old["retired"]:
                # Idempotent: the replacement made the first time is returned.
                successor = old.get("replaced_by")
                new = NodeBook.pool(data, pool.name)["nodes"].get(successor or "")
                return self._info(pool, new) if new else None
            old.update(retired=True, retired_at=time.time(), unschedulable=True)
            new = NodeBook.new_node(data, self.cluster, pool.name)
            old["replaced_by"] = new["name"]
        faults.kill_node(self.root, node)
        return self._info(pool, new)

    def _standbys(self, pool: PoolInfo) -> bool:
        """Whether the pool's nodes keep warm standbys: its own setting, else
        the cluster's; never where standbys cannot be reached (regatta/node/standby.py)."""
        own = pool.settings
        chosen = own.standbys if isinstance(own, LocalPoolSettings) else None
        return (self.standbys if chosen is None else chosen) and not standby.unavailable()

    def environment_waiting(self) -> str:
        """Why the fleet cannot run ranks yet (its torch still installing,
        worker_env.py), or "": jobs wait in the queue with this reason."""
        return worker_env.waiting_reason(self.python)

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        """Only Regatta places work on its nodes; a spare holds a warm standby."""
        if not self._standbys(pool) or self.environment_waiting():
            return
        standby.ensure(self.root, nodes, self.python,
                       attempts.standby_environment(self.standby_imports))

    def stop_standbys(self) -> None:
        """End the idle standbys (Regatta stopping; running attempts are
        stopped through `stop`)."""
        standby.stop_idle(self.root)

    # --- attempts ---------------------------------------------------------
    def launch(self, request: LaunchRequest) -> dict:
        problem = procs.unreadable()
        if problem:
            raise PermanentError(
                f"{self.cluster}: the local fleet cannot run ranks on this system: {problem}; "
                "it finds, stops and kills them by the tags in their environment")
        return attempts.launch(self.root, request, python=self.python,
                               standbys=self._standbys(request.pool),
                               standby_imports=self.standby_imports,
                               node_env=self._devices(request))

    @staticmethod
    def _devices_of(pool: PoolInfo) -> str:
        own = pool.settings
        return own.devices if isinstance(own, LocalPoolSettings) else devices.CPU

    def _devices(self, request: LaunchRequest) -> dict[str, dict[str, str]]:
        """Each node's CUDA_VISIBLE_DEVICES (devices.py), the GPUs it takes
        written into the book."""
        mode = self._devices_of(request.pool)
        gang = [p.node for p in sorted(request.placements, key=lambda p: p.node_rank)]
        where = f"{self.cluster}/{request.pool.name}"
        if mode == devices.CPU:
            return devices.gang_devices({}, gang, mode, request.pool.gpus_per_node, where)
        machine = devices.machine_gpus()  # nvidia-smi, before the book's lock is taken
        with self.book.edit() as data:
            live = {name: node for entry in data["pools"].values()
                    for name, node in entry["nodes"].items() if not node["retired"]}
            unknown = [n for n in gang if n not in live]
            if unknown:
                raise PermanentError(f"{where}: no live node {unknown[0]!r}")
            return devices.gang_devices(live, gang, mode, request.pool.gpus_per_node, where,
                                        machine)

    def observe(self, ref: dict) -> AttemptStatus:
        return attempts.observe(ref)

    def stop(self, ref: dict, grace_s: float = 30.0) -> None:
        attempts.stop(ref, grace_s)

    def describe_startup(self, ref: dict) -> tuple[RankActivity, ...]:
        """What each rank of a launched attempt is doing before its first
        step, from its node's records (startup.py)."""
        return startup.describe(ref)

    def preflight(self, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float = 60.0) -> PreflightResult:
        waiting = self.environment_waiting()
        if waiting:
            # Nothing can run the check yet (its torch still installing): no
            # answer, asked again by a later pass, and no node blamed.
            return PreflightResult(ok=False, pending=True, message=waiting)
        data = self.book.read()
        nodes = NodeBook.pool(data, pool.name)["nodes"]
        # A hung node (its processes frozen, the "hang" fault) fails the check
        # as a hung GPU fails an all-reduce: by timing out, said at once here.
        bad = {p.node for p in placements
               if nodes.get(p.node, {}).get("bad") or nodes.get(p.node, {}).get("hung")}
        return preflight.run_preflight(self.root, tuple(placements), bad, timeout_s,
                                       python=self.python, standbys=self._standbys(pool),
                                       gpus=self._devices_of(pool) == devices.CUDA)

    # --- health and faults ------------------------------------------------
    def health_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        with self.book.edit() as data:
            mine = [s for s in data["signals"] if s["pool"] == pool.name]
            data["signals"] = [s for s in data["signals"] if s["pool"] != pool.name]
        return [
            HealthSignal(node=s["node"], kind=s["kind"], severity=s["severity"],
                         message=s["message"], evidence=s["evidence"], key=s["key"])
            for s in mine
        ]

    def inject_fault(self, pool: PoolInfo, node: str, kind: str) -> dict:
        if kind not in FaultKind.ALL:
            raise PermanentError(f"unknown fault {kind!r}; one of {', '.join(FaultKind.ALL)}")
        if kind == FaultKind.KILL_RANK:
            with self.book.edit() as data:
                self._node(data, pool, node)  # a node of this pool, still in it
            return faults.kill_one_rank(self.root, node)
        with self.book.edit() as data:
            entry = self._node(data, pool, node)
            if kind in (FaultKind.XID, FaultKind.SPOT_NOTICE):
                record = faults.health_signal(pool.name, node, kind)
                data["signals"].append(record)
                return {"fault": kind, "node": node, "key": record["key"],
                        "evidence": record["evidence"]}
            if kind == FaultKind.PREFLIGHT_FAIL:
                entry["bad"] = True
                return {"fault": kind, "node": node, "bad": True}
            if kind == FaultKind.KILL:
                entry["down"] = True
                lost = faults.lost_signal(pool.name, node)
                data["signals"].append(lost)
            else:
                entry["hung"] = True
        if kind == FaultKind.KILL:
            return faults.kill_node(self.root, node)
        return faults.hang_node(self.root, node)

    def kill_rank(self, ref: dict, rank: int, sig: int = signal.SIGKILL) -> int:
        """Kill one rank process of a running attempt (tests: "a rank died")."""
        return faults.kill_rank(ref["dir"], rank, sig)
