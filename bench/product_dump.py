"""Where a product run stood when it stopped short: bench/gpu_product.py
writes this when a wait in its flow times out or the run is interrupted,
before it stops the control plane, so that one run on a GPU machine says
why it failed instead of only that it did.

What it holds, each part on its own (one that cannot be read says why and
the rest still comes):
- the job as the REST API shows it: phase, pending reason, last error,
  conditions; each attempt (state, nodes, exit code, failure, preflight,
  ranks heard from); every event with its evidence; each node (state,
  labels, spare, preflight pass) and the health events;
- the local fleet as it is on disk: the node book, each standby's record
  and log, each attempt's node folders (placement, launcher and exit
  records, the ranks' start-up markers and exit records, the launcher's
  log, the tail of torchrun's and the ranks' output), each preflight run's
  reports and logs;
- a process tree of the machine (pid, parent, state, CPU seconds, age, the
  fleet's tags, command line), the fleet's processes marked;
- what the machine offers the fleet: /proc, abstract Unix sockets, dcgmi.

Standard library only: it runs in the bench's own interpreter, without Django.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

TAIL_LINES = 60
_TAGS = ("REGATTA_LOCAL_FLEET", "REGATTA_LOCAL_ATTEMPT_DIR", "REGATTA_NODE", "RANK")


def dump(api, job_id: int | None, state: Path, why: str) -> str:
    out = [f"=== why the run stopped: {why}", f"=== at {time.strftime('%Y-%m-%d %H:%M:%S')}"]
    sections = [("the job", lambda: _job(api, job_id)), ("the nodes", lambda: _nodes(api)),
                ("the fleet on disk", lambda: _fleet(state / "fleet")),
                ("processes", lambda: process_tree(str(state))),
                ("this machine", machine)]
    for title, section in sections:
        out.append(f"\n##### {title}")
        try:
            out.append(section())
        except Exception as exc:  # noqa: BLE001 - one part unread never hides the others
            out.append(f"(could not be read: {type(exc).__name__}: {exc})")
    return "\n".join(out) + "\n"


def _json(data, limit: int = 4000) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def _results(page):
    return page["results"] if isinstance(page, dict) and "results" in page else page


def _job(api, job_id) -> str:
    if job_id is None:
        return "no job was submitted"
    job = api.get(f"jobs/{job_id}/")
    lines = [f"job #{job_id} {job.get('name')}: phase {job.get('phase')}, step "
             f"{job.get('current_step')}",
             f"pending reason: {job.get('pending_reason') or '-'}",
             f"last error: {job.get('last_error') or '-'}",
             f"conditions: {_json(job.get('conditions'))}", "", "attempts:"]
    for a in sorted(_results(api.get(f"jobs/{job_id}/attempts/")), key=lambda a: a["number"]):
        nodes = ", ".join(f"{n['node_rank']}:{n['node']} ({n.get('node_state')})"
                          for n in a.get("nodes") or ())
        lines.append(f"  #{a['number']} {a['state']} on [{nodes}] started {a.get('started_at')} "
                     f"first step {a.get('first_step_at')} ended {a.get('ended_at')} exit "
                     f"{a.get('exit_code')} class {a.get('failure_class')} last step "
                     f"{a.get('last_step')}")
        lines.append(f"     failure: {a.get('failure_reason') or '-'}")
        lines.append(f"     ranks heard from: {_json(a.get('ranks'), 1500)}")
        lines.append(f"     preflight: {_json(a.get('preflight'), 3000)}")
    lines += ["", "events:"]
    for e in sorted(_results(api.get(f"jobs/{job_id}/events/")), key=lambda e: e["id"]):
        lines.append(f"  {e.get('created_at')} {e.get('kind')}: {e.get('message')}")
        if e.get("evidence"):
            lines.append(f"     evidence: {_json(e['evidence'], 3000)}")
    return "\n".join(lines)


def _nodes(api) -> str:
    lines = []
    for n in sorted(_results(api.get("nodes/")), key=lambda n: n["id"]):
        lines.append(f"  {n['name']} {n['state']} spare={n['is_spare']} labels "
                     f"{_json(n.get('labels'))} preflight_passed_at {n.get('preflight_passed_at')}"
                     f" reason {n.get('state_reason') or '-'}")
    lines.append("health events:")
    for h in _results(api.get("health-events/")):
        lines.append(f"  {_json(h, 1500)}")
    return "\n".join(lines)


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"({exc.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def _file(path: Path, root: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    body = tail(path, lines)
    return f"--- {path.relative_to(root)}\n{body}" if body.strip() else ""


def _fleet(fleet: Path) -> str:
    if not fleet.is_dir():
        return f"{fleet}: no fleet folder (the cluster never reconciled)"
    out = []
    for cluster in sorted(p for p in fleet.iterdir() if p.is_dir()):
        out.append(_file(cluster / "nodes.json", fleet, 400))
        for path in sorted((cluster / "standby").glob("*/*")):
            out.append(_file(path, fleet, 30))
        for node_dir in sorted((cluster / "attempts").glob("*/node-*")):
            for path in sorted(node_dir.glob("*.json")) + sorted(node_dir.glob("status/*")):
                out.append(_file(path, fleet, 20))
            out.append(_file(node_dir / "launcher.err", fleet, 30))
            out.append(_file(node_dir / "stdout.log", fleet, 120))
        for run in sorted((cluster / "preflight").glob("*"))[-6:]:
            for path in sorted(run.glob("node-*")):
                if path.is_file():
                    out.append(_file(path, fleet, 40))
                else:
                    out.append(_file(path / "stdout.log", fleet, 40))
        out.append(_file(cluster / "killer.err", fleet, 20))
    return "\n".join(p for p in out if p)


def _environ(pid: str) -> dict:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in _TAGS:
            env[key.decode()] = value.decode(errors="replace")
    return env


def process_tree(mark: str) -> str:
    """Every process, as a forest by parent: pid, state, CPU s, age s, the
    fleet's tags, command line; '*' marks those whose tags or command line
    name `mark` (the run's state folder)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    procs = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                raw = fh.read().decode(errors="replace")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if not cmd:
            continue  # a kernel thread
        f = raw[raw.rindex(")") + 2:].split()
        env = _environ(pid)
        procs[int(pid)] = {
            "ppid": int(f[1]), "state": f[0], "cpu": (int(f[11]) + int(f[12])) / ticks,
            "age": uptime - int(f[19]) / ticks, "cmd": cmd[:200], "env": env,
            "mark": mark in cmd or any(mark in v for v in env.values()),
        }
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p["ppid"] if p["ppid"] in procs else 0, []).append(pid)
    lines = []

    def walk(pid: int, depth: int) -> None:
        p = procs[pid]
        tags = " ".join(f"{k.split('_')[-1].lower()}={os.path.basename(v)}"
                        for k, v in p["env"].items())
        lines.append(f"{'*' if p['mark'] else ' '} {'  ' * depth}{pid} {p['state']} "
                     f"cpu {p['cpu']:.1f}s age {p['age']:.0f}s {tags} :: {p['cmd']}")
        for child in sorted(children.get(pid, ())):
            walk(child, depth + 1)

    for root in sorted(children.get(0, ())):
        walk(root, 0)
    return "\n".join(lines)


def machine() -> str:
    """What the local fleet relies on, checked here: reading another
    process's environment in /proc, abstract Unix sockets, and dcgmi."""
    lines = [f"kernel: {os.uname().release} ({os.uname().version})"]
    child = subprocess.Popen(["sleep", "5"], env={"REGATTA_PROBE": "1"})
    try:
        time.sleep(0.2)
        with open(f"/proc/{child.pid}/environ", "rb") as fh:
            seen = b"REGATTA_PROBE=1" in fh.read()
        lines.append(f"/proc/<pid>/environ of a child: {'readable' if seen else 'EMPTY'}")
    except OSError as exc:
        lines.append(f"/proc/<pid>/environ of a child: unreadable ({exc})")
    finally:
        child.kill()
        child.wait()
    name = f"\0regatta-probe-{os.getpid()}"
    try:
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(name)
            server.listen(1)
            client.connect(name)
        lines.append("abstract Unix sockets: work")
    except OSError as exc:
        lines.append(f"abstract Unix sockets: FAIL ({exc})")
    dcgmi = shutil.which("dcgmi")
    lines.append(f"dcgmi: {dcgmi or 'not on PATH'}")
    if dcgmi:
        try:
            done = subprocess.run([dcgmi, "diag", "-r", "1"], capture_output=True, text=True,
                                  timeout=60)
            lines.append(f"dcgmi diag -r 1: exit {done.returncode}: "
                         f"{(done.stdout + done.stderr).strip()[-600:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"dcgmi diag -r 1: {exc}")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run([smi, "--query-gpu=index,name,memory.used,utilization.gpu",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=30)
            lines.append(f"nvidia-smi: {done.stdout.strip() or done.stderr.strip()}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            lines.append(f"nvidia-smi: {exc}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(machine())
