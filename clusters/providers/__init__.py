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
    ScalingFailure,
    ScalingStatus,
)
from .registry import get_provider, pool_info

__all__ = [
    "AttemptStatus", "FaultKind", "HealthSignal", "LaunchRequest", "NodeInfo", "NodeProcess",
    "Placement", "PoolInfo", "PreflightResult", "Provider", "ScalingFailure", "ScalingStatus",
    "get_provider", "pool_info",
]
