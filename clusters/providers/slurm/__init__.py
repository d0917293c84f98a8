"""Slurm provider: a partition as the fleet, one sbatch per attempt (docs/slurm.md)."""

from .provider import SlurmPoolSettings, SlurmProvider, SlurmSettings

__all__ = ["SlurmPoolSettings", "SlurmProvider", "SlurmSettings"]
