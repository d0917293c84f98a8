"""An in-memory provider: a fleet that lives in this process.

It backs the unit tests of the reconcilers and the scale benchmarks, where no
process can or should be started; it is not part of the product, and is
registered as provider kind "memory" by the test suite (tests/conftest.py)
and the benchmarks that use it (`register()`). Tests drive it like a fleet would behave:
`exit_node` (a rank exited or was killed), `finish` (every rank exited 0),
`signal` (an XID, a spot notice), `fail_preflight` (a node fails its check).
State is per cluster name and shared by every instance in the process, as a
real fleet is shared by every worker; `reset()` clears it between tests.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field, replace

from clusters.providers import registry
from clusters.providers.base import (
    AttemptStatus,
    HealthSignal,
    LaunchRequest,
    NodeCheck,
    NodeInfo,
    NodeProcess,
    NoSettings,
    Placement,
    PoolInfo,
    PreflightResult,
    preflight_evidence,
)
from controlplane.lib.errors import PermanentError
from controlplane.lib.typed_settings import setting

KIND = "memory"


def register() -> None:
    registry.register(KIND, MemoryProvider)


@dataclass(frozen=True)
class MemoryPoolSettings:
    fixed_size: bool = setting(False, "the pool cannot grow (no spares can be added)")
    keeps_machines: bool = setting(False, "replacing a node drains it and brings up nothing, "
                                   "as Slurm does: the machine waits for its owner to mend "
                                   "and resume it (and the pool cannot grow)")


@dataclass
class _Attempt:
    request: LaunchRequest
    nodes: dict[str, NodeProcess]
    stopped: bool = False


@dataclass
class _Fleet:
    nodes: dict[tuple[str, str], dict[str, NodeInfo]] = field(default_factory=dict)
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    signals: dict[tuple[str, str], list[HealthSignal]] = field(default_factory=dict)
    preflight_failures: set[str] = field(default_factory=set)
    calls: list[tuple] = field(default_factory=list)
    counter: itertools.count = field(default_factory=lambda: itertools.count(1))


_FLEETS: dict[str, _Fleet] = {}
_LOCK = threading.RLock()


def reset() -> None:
    with _LOCK:
        _FLEETS.clear()


def fleet(cluster_name: str) -> _Fleet:
    with _LOCK:
        return _FLEETS.setdefault(cluster_name, _Fleet())


class MemoryProvider:
    kind = KIND
    Settings = NoSettings
    PoolSettings = MemoryPoolSettings

    def __init__(self, cluster_name: str):
        self.cluster_name = cluster_name
        self.fleet = fleet(cluster_name)

    @classmethod
    def for_cluster(cls, name: str, settings=None) -> MemoryProvider:
        return cls(name)

    # --- what tests and benchmarks set up ------------------------------------
    def add_nodes(self, pool: PoolInfo, count: int, prefix: str | None = None) -> list[NodeInfo]:
        made = []
        with _LOCK:
            nodes = self._pool_nodes(pool)
            for _ in range(count):
                name = f"{prefix or pool.cluster + '-' + pool.name}-m{next(self.fleet.counter)}"
                nodes[name] = NodeInfo(name=name, provider_id=f"mem://{name}",
                                       address="127.0.0.1", gpus=pool.gpus_per_node)
                made.append(nodes[name])
        return made

    def remove_node(self, pool: PoolInfo, name: str) -> None:
        with _LOCK:
            self._pool_nodes(pool).pop(name, None)

    def exit_node(self, ref: dict, node: str, exit_code: int | None = None,
                  signal: int | None = None, ranks: tuple[dict, ...] = (),
                  log_tail: str = "") -> None:
        """The part of the attempt on `node` ended (a code, or killed by a signal)."""
        with _LOCK:
            attempt = self.fleet.attempts[ref["name"]]
            proc = attempt.nodes[node]
            attempt.nodes[node] = replace(proc, running=False, exit_code=exit_code,
                                          signal=signal, ranks=ranks, log_tail=log_tail)

    def finish(self, ref: dict) -> None:
        with _LOCK:
            attempt = self.fleet.attempts[ref["name"]]
            for name, proc in attempt.nodes.items():
                attempt.nodes[name] = replace(proc, running=False, exit_code=0)

    def signal(self, pool: PoolInfo, node: str, kind: str, severity: str = "critical",
               message: str = "", evidence: dict | None = None, key: str = "") -> None:
        sig = HealthSignal(node=node, kind=kind, severity=severity, message=message or kind,
                           evidence=evidence or {}, key=key or f"{node}:{kind}")
        with _LOCK:
            self.fleet.signals.setdefault((pool.cluster, pool.name), []).append(sig)

    def fail_preflight(self, node: str) -> None:
        with _LOCK:
            self.fleet.preflight_failures.add(node)

    def attempt(self, ref: dict) -> _Attempt:
        return self.fleet.attempts[ref["name"]]

    # --- the protocol ------------------------------------------------------
    def _pool_nodes(self, pool: PoolInfo) -> dict[str, NodeInfo]:
        return self.fleet.nodes.setdefault((pool.cluster, pool.name), {})

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        with _LOCK:
            return list(self._pool_nodes(pool).values())

    def provision_node(self, pool: PoolInfo, name: str) -> NodeInfo:
        if pool.settings.fixed_size or pool.settings.keeps_machines:
            # Like a Kubernetes pool with no Auto Scaling group behind it.
            raise PermanentError(f"pool {pool.name} cannot grow: it has a fixed size")
        with _LOCK:
            nodes = self._pool_nodes(pool)
            if name not in nodes:
                nodes[name] = NodeInfo(name=name, provider_id=f"mem://{name}",
                                       address="127.0.0.1", gpus=pool.gpus_per_node)
            self.fleet.calls.append(("provision_node", name))
            return nodes[name]

    def launch(self, request: LaunchRequest) -> dict:
        with _LOCK:
            self.fleet.calls.append(("launch", request.name))
            # Launching the same attempt twice starts it once.
            if request.name not in self.fleet.attempts:
                self.fleet.attempts[request.name] = _Attempt(
                    request=request,
                    nodes={p.node: NodeProcess(node=p.node, node_rank=p.node_rank, running=True)
                           for p in request.placements},
                )
            return {"name": request.name, "provider": "memory"}

    def observe(self, ref: dict) -> AttemptStatus:
        with _LOCK:
            attempt = self.fleet.attempts.get(ref.get("name", ""))
            if attempt is None:
                return AttemptStatus(state="unknown", message="no such attempt")
            nodes = tuple(sorted(attempt.nodes.values(), key=lambda n: n.node_rank))
        if any(n.running for n in nodes):
            state = "running"
        elif all(n.exit_code == 0 and n.signal is None for n in nodes):
            state = "succeeded"
        else:
            state = "failed"
        status = AttemptStatus(state=state, nodes=nodes)
        if state == "running" and status.failed_nodes:
            return AttemptStatus(state="failed", nodes=nodes, message="a node's ranks ended")
        return status

    def stop(self, ref: dict, grace_s: float = 30.0) -> None:
        with _LOCK:
            self.fleet.calls.append(("stop", ref.get("name")))
            attempt = self.fleet.attempts.get(ref.get("name", ""))
            if attempt is None or attempt.stopped:
                return
            attempt.stopped = True
            for name, proc in attempt.nodes.items():
                if proc.running:
                    attempt.nodes[name] = replace(proc, running=False, signal=15)

    def preflight(self, pool: PoolInfo, placements: tuple[Placement, ...],
                  timeout_s: float = 60.0) -> PreflightResult:
        with _LOCK:
            self.fleet.calls.append(("preflight", tuple(p.node for p in placements)))
            failed = tuple(p.node for p in placements if p.node in self.fleet.preflight_failures)
        per_node: dict[str, NodeCheck] = {
            p.node: ({"ok": False, "check": "allreduce", "error": "collective test failed"}
                     if p.node in failed else {"ok": True, "busbw_gbps": 10.0})
            for p in placements
        }
        return PreflightResult(
            ok=not failed, failed_nodes=failed,
            evidence=preflight_evidence(per_node, seconds=0.0),
            message=f"collective test failed on {', '.join(failed)}" if failed else "ok",
        )

    def cordon(self, pool: PoolInfo, node: str) -> None:
        self._set_unschedulable(pool, node, True)

    def uncordon(self, pool: PoolInfo, node: str) -> None:
        self._set_unschedulable(pool, node, False)

    def _set_unschedulable(self, pool: PoolInfo, node: str, value: bool) -> None:
        with _LOCK:
            nodes = self._pool_nodes(pool)
            if node in nodes:
                nodes[node] = replace(nodes[node], unschedulable=value)

    def drain(self, pool: PoolInfo, node: str, grace_s: float = 60.0) -> None:
        with _LOCK:
            self.fleet.calls.append(("drain", node))
        self._set_unschedulable(pool, node, True)

    def replace(self, pool: PoolInfo, node: str) -> NodeInfo | None:
        if pool.settings.keeps_machines:
            self.fleet.calls.append(("replace", node))
            self._set_unschedulable(pool, node, True)
            return None
        with _LOCK:
            nodes = self._pool_nodes(pool)
            self.fleet.calls.append(("replace", node))
            if node not in nodes:
                return None  # already retired: replacing twice retires once
            nodes.pop(node)
            name = f"{pool.cluster}-{pool.name}-m{next(self.fleet.counter)}"
            nodes[name] = NodeInfo(name=name, provider_id=f"mem://{name}",
                                   address="127.0.0.1", gpus=pool.gpus_per_node)
            return nodes[name]

    def hold_spares(self, pool: PoolInfo, nodes: list[str]) -> None:
        pass  # only Regatta places work on its nodes

    def health_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        with _LOCK:
            return self.fleet.signals.pop((pool.cluster, pool.name), [])
