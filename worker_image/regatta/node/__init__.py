"""The node side of Regatta's own fleets: the programs that run on a node
beside its ranks, shipped with the worker package because a node has the
worker's Python and this package, never the control plane's code.

- `launcher`: the per-node wrapper around torchrun (the local fleet runs it
  detached, a Slurm job step in the foreground), and a drain's deadline;
- `standby`: a node's warm standby on the local fleet, which forks torchrun's
  agent and the ranks with torch imported ahead;
- `procs`: finding and signalling a fleet's processes by their tags in /proc;
- `files`: the atomic JSON files the node programs and the control plane
  share, and the lock that serialises their writers.

Each runs as `python -m regatta.node.<name>` on the node; the control plane
imports them too (the local and Slurm providers start, hand over to, find
and stop them). Standard library and `regatta.contract` only at module
level: a program starts before anything else is imported, and the control
plane installs no torch (the standby imports it in its own process alone).
"""
