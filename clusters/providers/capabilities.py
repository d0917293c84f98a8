"""What a provider may do beyond the core (base.Provider), one protocol each.

A provider has a capability by having its methods, nothing else: callers ask
`isinstance(provider, Capability)` (or `issubclass` of the registered class,
to decide without building a provider) and do without it otherwise, so a
provider never carries a stub that answers "nothing" or raises "not here"
for the sake of one interface. Which provider has which is pinned by
tests/clusters/providers/test_capabilities.py:

| capability | local | slurm | kubernetes |
| --- | --- | --- | --- |
| ReportsHealth | yes | no (a down node is `ready=False`) | yes |
| TracksScaling | no | no | yes (an Auto Scaling group) |
| InjectsFaults | yes | no | no |
| WaitsForEnvironment | yes | no | no |
| DescribesStartup | yes | no | no |
| KeepsLateLogs | no | no | yes |
| ClaimsCordons | no | no | yes |

Only methods here, no data members: `issubclass` works on them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .base import HealthSignal, LateLog, PoolInfo, RankActivity, ScalingStatus


@runtime_checkable
class ReportsHealth(Protocol):
    """Health signals beyond a node's readiness: XIDs, spot notices, node
    conditions. Without it a pool's only evidence is what `list_nodes` says."""

    def health_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        """Health signals seen since the last call (XIDs, spot notices, ...)."""


@runtime_checkable
class TracksScaling(Protocol):
    """Capacity that comes later, if at all, from a node source of its own
    (an Auto Scaling group): its account of the asks, and machines it holds
    after their node retired. Without it capacity is there when asked
    (settled at once) and a retired node holds nothing (clusters/reconcile/
    scaling.py)."""

    def scaling_status(self, pool: PoolInfo, since) -> ScalingStatus:
        """How the asks for capacity made since `since` (an aware datetime) went."""

    def release(self, pool: PoolInfo, node: str, provider_id: str) -> str | None:
        """The retired node's machine is drained: let it go now rather than
        when a termination hook times out. Returns what was done ("" when
        nothing held it), or None to be asked again in a later pass."""


@runtime_checkable
class InjectsFaults(Protocol):
    """Operators' fault injection (FaultKind), for tests and demos."""

    def inject_fault(self, pool: PoolInfo, node: str, kind: str) -> dict:
        """Make `node` misbehave as `kind` says; returns the evidence."""


@runtime_checkable
class WaitsForEnvironment(Protocol):
    """A fleet that may not be able to run ranks yet (its torch still
    installing): jobs wait in the queue with the reason (jobs/admission)."""

    def environment_waiting(self) -> str:
        """Why the fleet cannot run ranks yet, or ""."""


@runtime_checkable
class DescribesStartup(Protocol):
    """What each rank of a launched attempt does before its first step, read
    on its node (jobs/reconcile/startup.py writes it on the timeline)."""

    def describe_startup(self, ref: dict) -> tuple[RankActivity, ...]:
        ...


@runtime_checkable
class KeepsLateLogs(Protocol):
    """Failed ranks' logs that could not be read at the failure, kept and
    read once more by a later cluster pass (clusters/reconcile/late_logs.py)."""

    def late_logs(self, now: float | None = None) -> list[LateLog]:
        """The kept logs, read once more; `now` in Unix seconds."""


@runtime_checkable
class ClaimsCordons(Protocol):
    """Holds told apart by a mark of Regatta's (a Kubernetes annotation): a
    hold Regatta made without the mark can be marked as its own
    (clusters/reconcile/follow.py)."""

    def claim_cordon(self, pool: PoolInfo, node: str) -> None:
        ...


CAPABILITIES = (ReportsHealth, TracksScaling, InjectsFaults, WaitsForEnvironment,
                DescribesStartup, KeepsLateLogs, ClaimsCordons)


def capabilities_of(provider_or_class) -> tuple[str, ...]:
    """The names of the capabilities a provider (or its class) has."""
    check = issubclass if isinstance(provider_or_class, type) else isinstance
    return tuple(c.__name__ for c in CAPABILITIES if check(provider_or_class, c))
