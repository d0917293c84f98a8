"""What each rank of a launched attempt is doing before its first step, read
on the node from the records its launcher, standby and ranks keep in the
attempt's folder (the provider's `describe_startup`):

- `node-<i>/launcher.json`: the launcher and its torchrun started, cold or
  handed to the node's standby (`warm`, with the standby's own account);
- `node-<i>/status/startup-<rank>.json`: the phase the rank's SDK entered
  last (regatta/startup.py: config, rendezvous, setup, resume, compiling,
  training, stepping), or `started` from a warm rank's bootstrap
  (regatta/node/standby.py), each with its time;
- `node-<i>/status/rank-<rank>.json`, `exit.json`: how a rank, or the
  node's torchrun, ended;
- /proc: whether the rank's process exists (by its tags,
  regatta/node/procs.py), and the CPU it used: a rank with no marker that
  burns CPU is importing, one that burns none waits.

A program without the SDK leaves no markers: its ranks read as importing
for as long as they live, with their CPU time beside it.
"""

from __future__ import annotations

import time
from pathlib import Path

from regatta import contract
from regatta.node import procs
from regatta.node.files import read_json

from ..base import RankActivity

# The SDK's phase names (regatta/startup.py) in the protocol's words.
_PHASES = {
    "started": "importing", "config": "importing", "start": "importing",
    "rendezvous": "rendezvous", "setup": "setting up", "resume": "loading checkpoint",
    "compiling": "compiling", "training": "first step", "stepping": "running without reporting",
}
_SAYS = {
    "importing": "importing its program (Python and torch)",
    "rendezvous": "waiting in rendezvous (torch.distributed init_process_group) for its peers",
    "setting up": "building its model",
    "loading checkpoint": "loading the checkpoint it resumes from",
    "compiling": "compiling (torch.compile, in its first step)",
    "first step": "in its first step",
    "running without reporting": "running, yet none of its reports reached the control plane",
}


def nproc_of(node_dir: Path) -> int:
    argv = (read_json(node_dir / "placement.json") or {}).get("argv") or []
    for arg in argv:
        if isinstance(arg, str) and arg.startswith("--nproc_per_node="):
            value = arg.split("=", 1)[1]
            return int(value) if value.isdigit() else 1
    return 1


def describe(ref: dict, now: float | None = None) -> tuple[RankActivity, ...]:
    now = time.time() if now is None else now
    attempt_dir = Path(ref["dir"])
    # The ranks' own records first, their processes after: a rank tags its
    # process before it writes its first marker, so a marker read before
    # the scan began belongs to a process the scan can see. The other way
    # round, a rank that started during the scan (its /proc entry read
    # before it was tagged) would read as gone after "started".
    wanted = []
    for entry in sorted(ref.get("nodes") or (), key=lambda e: e["node_rank"]):
        node_dir = attempt_dir / f"node-{entry['node_rank']}"
        nproc = nproc_of(node_dir)
        for local in range(nproc):
            rank = entry["node_rank"] * nproc + local
            status = node_dir / "status"
            wanted.append((node_dir, entry["node"], rank,
                           read_json(status / contract.startup_file(rank)) or {},
                           read_json(status / contract.status_file(rank))))
    ranks = {p.rank: p for p in procs.top_ranks(procs.scan(attempt_dir=str(attempt_dir)))}
    return tuple(_rank(node_dir, node, rank, marker, ended, ranks.get(rank), now)
                 for node_dir, node, rank, marker, ended in wanted)


def _rank(node_dir: Path, node: str, rank: int, marker: dict, ended: dict | None,
          proc: procs.Proc | None, now: float) -> RankActivity:
    if proc is None and not ended:  # it may have ended during the scan: read it again
        ended = read_json(node_dir / "status" / contract.status_file(rank))
    if ended:
        return RankActivity(rank, node, "exited", None,
                            f"exited {ended.get('exit_code')}: {ended.get('error') or 'no error'}"
                            [:300])
    if proc is None:
        return _no_process(node_dir, node, rank, marker, now)
    used = procs.usage(proc.pid)
    phase = _PHASES.get(marker.get("phase", ""), "importing") if marker else "importing"
    since = round(now - marker["at"], 1) if marker.get("at") else (used[1] if used else None)
    detail = _SAYS[phase]
    if phase == "running without reporting" and marker.get("step") is not None:
        detail = f"ran step {marker['step']}, yet none of its reports reached the control plane"
    if not marker:
        detail += " (no start-up marker yet)"
    if used:
        detail += f"; process {proc.pid}, CPU {used[0]:g} s in {used[1]:g} s"
    return RankActivity(rank, node, phase, since, detail, marked=bool(marker))


def _no_process(node_dir: Path, node: str, rank: int, marker: dict,
                now: float) -> RankActivity:
    launcher = read_json(node_dir / "launcher.json") or {}
    ended = read_json(node_dir / "exit.json")
    if marker:
        return RankActivity(rank, node, "gone", round(now - marker.get("at", now), 1),
                            f"its process is gone after {marker.get('phase')!r}, with no exit "
                            "record", marked=True)
    if ended:
        return RankActivity(rank, node, "exited", None,
                            f"its node's torchrun ended ({_how(ended)}) before it started")
    if not launcher:
        return RankActivity(rank, node, "not started", None, "no launcher on its node yet")
    since = round(now - launcher.get("started_at", now), 1)
    agent = launcher.get("torchrun_pid")
    used = procs.usage(agent) if agent and procs.is_running(
        agent, launcher.get("torchrun_starttime")) else None
    how = "handed to the node's warm standby" if launcher.get("warm") else "started cold"
    if used is None:
        return RankActivity(rank, node, "not started", since,
                            f"{how}; its torchrun (pid {agent}) is gone")
    return RankActivity(rank, node, "not started", since,
                        f"{how}; its torchrun (pid {agent}, CPU {used[0]:g} s in {used[1]:g} s) "
                        "has started no rank yet: importing torch, or waiting for the other "
                        "nodes' torchrun")


def _how(ended: dict) -> str:
    if ended.get("signal"):
        return f"signal {ended['signal']}"
    return f"exit code {ended.get('exit_code')}"
