"""Providers: how the control plane reaches a fleet. See base.py."""

from .base import (
    AttemptStatus,
    FaultKind,
    HealthSignal,
    LaunchRequest,
    NodeInfo,
    NodeProcess,
    Placement,
    PoolInfo,
    PreflightResult,
    Provider,
)
from .registry import get_provider, pool_info

__all__ = [
    "AttemptStatus", "FaultKind", "HealthSignal", "LaunchRequest", "NodeInfo", "NodeProcess",
    "Placement", "PoolInfo", "PreflightResult", "Provider", "get_provider", "pool_info",
]
