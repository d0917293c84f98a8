"""Launching, observing and stopping attempts as Slurm batch jobs.

An attempt lives in `<shared_dir>/<name>/`, a folder every Slurm node sees at
the same path (the shared file system checkpoints go to): `batch.sh`,
`node.sh`, `batch.log`, `ref.json`, and per node `node-<rank>/` with the
launcher's `exit.json`, `stdout.log` and the ranks' `status/rank-<r>.json`.
Slurm says whether the job is pending, running or over (and why); the files
say how each node's torchrun ended, which Slurm's one exit code cannot.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

from regatta import contract
from regatta.node.files import file_lock, read_json, write_json

from controlplane.lib.errors import CannotRun, PermanentError, TemporaryError

from ..base import AttemptStatus, LaunchRequest, NodeProcess, StartIssue
from ..local.attempts import ended_log, rank_records
from ..local.environment import rank_environment
from . import batch
from .commands import Slurm, SlurmCommandError
from .nodes import LOST, REASON_PREFIX, state_words

ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                    "RESIZING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING",
                    "STAGE_OUT", "STOPPED"})


def comment(cluster: str) -> str:
    """Marks Regatta's own jobs in `squeue` (a drain signals only those)."""
    return f"regatta:{cluster}"


def launch(slurm: Slurm, shared: Path, cluster: str, partition: str, feature: str,
           request: LaunchRequest, python: str, reservation: str = "") -> dict:
    if not request.placements:
        raise PermanentError(f"attempt {request.name}: no placements")
    attempt_dir = shared / request.name
    with file_lock(shared / f"{request.name}.lock"):
        existing = read_json(attempt_dir / "ref.json")
        if existing:
            return existing
        # Submitted by a launch that died before writing ref.json: that job
        # is the attempt, never a second one beside it.
        found = slurm.run(["squeue", "-h", "-n", request.name, "-o", "%i %k"]).split()
        if len(found) >= 2 and found[1] == comment(cluster):
            job_id = found[0]
        else:
            job_id = _submit(slurm, attempt_dir, cluster, partition, feature, request, python,
                             reservation)
        ref = {"job_id": job_id, "dir": str(attempt_dir), "name": request.name,
               "nodes": [{"node": p.node, "node_rank": p.node_rank}
                         for p in sorted(request.placements, key=lambda p: p.node_rank)]}
        write_json(attempt_dir / "ref.json", ref)
        return ref


def _submit(slurm: Slurm, attempt_dir: Path, cluster: str, partition: str, feature: str,
            request: LaunchRequest, python: str, reservation: str) -> str:
    if attempt_dir.exists():
        shutil.rmtree(attempt_dir)  # a launch that died before sbatch: start over
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "node.sh").write_text(batch.node_script(str(attempt_dir), python, request))
    script = attempt_dir / "batch.sh"
    script.write_text(batch.batch_script(str(attempt_dir), python, request))
    # The job's environment is the submitter's (--export=ALL): only what
    # the ranks may see, never the control plane's own secrets.
    env = rank_environment({"OMP_NUM_THREADS": "1", **request.env})
    if request.checkpoint_uri:
        env.setdefault(contract.CHECKPOINT_URI, request.checkpoint_uri)
    nodes = sorted(request.placements, key=lambda p: p.node_rank)
    argv = [
        "sbatch", "--parsable", f"--job-name={request.name}", f"--partition={partition}",
        f"--nodes={len(nodes)}", f"--nodelist={','.join(p.node for p in nodes)}",
        "--ntasks-per-node=1", "--exclusive",
        # Regatta decides relaunches, on nodes it chose: Slurm's own requeue
        # would race it (and waits ~120 s before a requeued job may start).
        "--no-requeue", f"--comment={comment(cluster)}", "--export=ALL",
        f"--chdir={attempt_dir}", f"--output={attempt_dir / 'batch.log'}",
    ]
    if request.pool.gpus_per_node:
        argv.append(f"--gpus-per-node={request.pool.gpus_per_node}")
    if feature:
        argv.append(f"--constraint={feature}")
    if reservation:
        argv.append(f"--reservation={reservation}")
    try:
        out = slurm.run([*argv, str(script)], env=env)
    except SlurmCommandError as exc:
        if _NEVER.search(str(exc)):
            raise CannotRun(f"Slurm refuses the attempt for good: {exc}") from exc
        raise
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise TemporaryError(f"sbatch answered {out!r}", delay=5.0)
    return job_id


# What sbatch answers for a request no node of the partition can ever meet
# (more GPUs a node than any has, a feature none carries): no retry helps.
_NEVER = re.compile(r"Requested node configuration is not available|"
                    r"Invalid generic resource \(gres\) specification|"
                    r"Invalid feature specification|Node count specification invalid|"
                    r"Invalid partition name specified", re.IGNORECASE)


def job_record(slurm: Slurm, ref: dict) -> dict:
    """slurmctld's record of the attempt's job; once it forgot the job
    (MinJobAge after its end), the accounting's (`sacct`); {} with neither."""
    found = slurm.show("job", str(ref["job_id"]))
    return found[0] if found else slurm.accounted(str(ref["job_id"]))


def _node(slurm: Slurm, name: str) -> dict:
    found = slurm.show("node", name)
    return found[0] if found else {}


def _observe_node(slurm: Slurm, attempt_dir: Path, entry: dict, active: bool) -> NodeProcess:
    node_dir = attempt_dir / f"node-{entry['node_rank']}"
    ended = read_json(node_dir / "exit.json")
    exit_code = sig = None
    running = active and not ended
    lost = ""
    if ended:
        exit_code, sig = ended.get("exit_code"), ended.get("signal")
    elif not active:
        # The job is over and this node's launcher never wrote how torchrun
        # ended: it was killed (scancel, or the node went with it).
        sig = signal.SIGKILL.value
    if not ended:
        node = _node(slurm, entry["node"])
        if state_words(node.get("State", "")) & LOST:
            lost = (f"Slurm reports {entry['node']} {node.get('State')}: "
                    f"{node.get('Reason', '')}").strip(": ")
            running = False
            sig = sig or signal.SIGKILL.value
    return NodeProcess(
        node=entry["node"], node_rank=entry["node_rank"], running=running,
        exit_code=exit_code, signal=sig, ranks=rank_records(node_dir / "status"),
        log_tail=ended_log(node_dir / "stdout.log") if not running else "", node_lost=lost,
    )


def _silent_since(attempt_dir: Path, node_rank: int, silence_s: float) -> float | None:
    """When the node's launcher last beat, if that is over `silence_s` ago;
    None while it beats (or never started)."""
    beat = read_json(attempt_dir / f"node-{node_rank}" / "beat.json")
    at = beat.get("at") if beat else None
    if at is None or time.time() - at <= silence_s:
        return None
    return at


def _gone_with_launcher(attempt_dir: Path, nodes: tuple[NodeProcess, ...],
                        silence_s: float) -> tuple[NodeProcess, ...]:
    """Once a node's part has failed, a peer whose launcher stopped beating
    with no exit record went with its node: its ranks and the launcher that
    would have recorded their end are gone together, which one process's
    death (the OOM killer's pick) never does. Slurm calls such a node DOWN
    only after its SlurmdTimeout, and not responding some seconds before;
    the survivors' collective fails at once, so this is known first."""
    if not any(_failed(n) for n in nodes):
        return nodes
    out = []
    for n in nodes:
        since = _silent_since(attempt_dir, n.node_rank, silence_s) if n.running else None
        if since is not None:
            n = replace(n, running=False, signal=n.signal or signal.SIGKILL.value,
                        node_lost=f"{n.node}: its launcher went silent at "
                                  f"{time.strftime('%H:%M:%S', time.gmtime(since))} UTC "
                                  f"with no exit record, after a peer's part failed")
        out.append(n)
    return tuple(out)


def _failed(n: NodeProcess) -> bool:
    return not n.running and bool(n.signal or (n.exit_code or 0) != 0)


def observe(slurm: Slurm, ref: dict, silence_s: float) -> AttemptStatus:
    attempt_dir = Path(ref["dir"])
    job = job_record(slurm, ref)
    state = job.get("JobState", "")
    active = state in ACTIVE
    where = f"Slurm job {ref['job_id']} {state or 'unknown to slurmctld'}"
    if state == "PENDING":
        # Slurm's own reason: Resources, Priority, ReqNodeNotAvail, ...; the
        # literal "None" until its scheduler has looked at the job.
        reason = job.get("Reason", "")
        if reason in ("", "None"):
            reason = "Pending"
        return AttemptStatus(state="running", message=f"{where}: {reason}",
                             start_issues=(StartIssue(reason=reason, message=where),))
    if not job and not attempt_dir.is_dir():
        return AttemptStatus(state="unknown", message=f"{where}; {attempt_dir} is missing")
    nodes = tuple(_observe_node(slurm, attempt_dir, e, active) for e in ref["nodes"])
    nodes = _gone_with_launcher(attempt_dir, nodes, silence_s)
    failed = [n for n in nodes if _failed(n)]
    if failed:
        # A lost node is the cause; the others' failed collectives follow it.
        first = next((n for n in failed if n.node_lost), failed[0])
        how = f"signal {first.signal}" if first.signal else f"exit code {first.exit_code}"
        return AttemptStatus(
            state="failed", nodes=nodes,
            message=f"node {first.node} (rank {first.node_rank}) ended by {how}; {where}, "
                    f"exit {job.get('ExitCode', '?')}, {job.get('Reason', '')}".rstrip(", "))
    if any(n.running for n in nodes):
        return AttemptStatus(state="running", nodes=nodes, message=where)
    if not job and not all(read_json(attempt_dir / f"node-{e['node_rank']}" / "exit.json")
                           for e in ref["nodes"]):
        return AttemptStatus(state="unknown", nodes=nodes, message=where)
    return AttemptStatus(state="succeeded", nodes=nodes, message=f"every node exited 0; {where}")


def _wait_for(slurm: Slurm, ref: dict, timeout: float, done) -> str | None:
    """The job's state once `done(state)` holds, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        state = job_record(slurm, ref).get("JobState", "")
        if done(state):
            return state
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def _parts_left(ref: dict, silence_s: float) -> tuple[list[str], list[str]]:
    """The nodes whose part has recorded no end: those still beating, and
    those gone silent with their node."""
    attempt_dir = Path(ref["dir"])
    running, silent = [], []
    for entry in ref["nodes"]:
        if read_json(attempt_dir / f"node-{entry['node_rank']}" / "exit.json"):
            continue
        silent_since = _silent_since(attempt_dir, entry["node_rank"], silence_s)
        (running if silent_since is None else silent).append(entry["node"])
    return running, silent


_OVER_ALREADY = ("Invalid job id", "already completing or completed", "already completed")


def scancel(slurm: Slurm, *args: str) -> None:
    """scancel, where a job that ended meanwhile is what was asked for."""
    try:
        slurm.run(["scancel", *args])
    except SlurmCommandError as exc:
        if not any(words in str(exc) for words in _OVER_ALREADY):
            raise


def stop(slurm: Slurm, ref: dict, grace_s: float, silence_s: float) -> None:
    """SIGTERM the job's steps (the trainer checkpoints and exits 83), then
    cancel it outright after `grace_s`, or as soon as nothing but lost nodes
    is left to end: Slurm SIGKILLs what is left after its KillWait. Over
    when slurmctld says the job is."""
    job = job_record(slurm, ref)
    state = job.get("JobState", "")
    if state not in ACTIVE:
        return
    job_id = str(ref["job_id"])
    if state != "PENDING":
        # The batch shell waits for the scancel below once its steps end
        # (batch.py): the job is over by Regatta's word, CANCELLED in
        # Slurm's accounting, not failed by the ranks' SIGTERM.
        (Path(ref["dir"]) / batch.STOPPING).touch()
        # Steps only: the batch shell stays to see srun end and the job out.
        try:
            scancel(slurm, "--signal=TERM", job_id)
        except SlurmCommandError:
            # Steps ending meanwhile leave nothing to signal (22.05 exits
            # non-zero, saying nothing): the cancel below ends what is left.
            pass
        ended = _wait_for(slurm, ref, grace_s, lambda state: state not in ACTIVE
                          or not _parts_left(ref, silence_s)[0])
        if ended is not None and ended not in ACTIVE:
            return
    scancel(slurm, job_id)
    state = _wait_for(slurm, ref, 60.0, lambda state: state not in ACTIVE or (
        state == "COMPLETING" and not _parts_left(ref, silence_s)[0]))
    if state == "COMPLETING":
        # Slurm holds a job COMPLETING until it hears from each of its nodes,
        # so a lost node holds it (and the next attempt's start) until its
        # SlurmdTimeout: Regatta, which knows the node went with its ranks,
        # calls it DOWN, and Slurm ends the job at once.
        for node in _parts_left(ref, silence_s)[1]:
            slurm.run(["scontrol", "update", f"nodename={node}", "state=down",
                       f"reason={REASON_PREFIX}lost: its launcher went silent with job {job_id}'s "
                       "ranks"])
        state = _wait_for(slurm, ref, 30.0, lambda state: state not in ACTIVE)
    if state is None:
        raise TemporaryError(f"Slurm job {job_id} still active after scancel", delay=5.0)
