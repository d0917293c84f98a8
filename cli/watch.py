"""`regatta watch`: poll a job until it ends, drawing a progress line."""

from __future__ import annotations

import json
import sys
import time

import click

from . import output
from .client import ApiError, Client, CliError

TERMINAL = {"succeeded": 0, "failed": 1, "cancelled": 3}
BAR = 24
# A few failed polls in a row (a restarting server) are waited out, not fatal.
MAX_MISSES = 5


def latest_loss(client: Client, job_id: int):
    # LTTB keeps the first and the last point, so two points carry the newest.
    data = client.get(f"jobs/{job_id}/metrics/", name="loss", points=2)
    points = data.get("points") or []
    return points[-1][1] if points else None


def snapshot(client: Client, job_id: int) -> dict:
    job = client.get(f"jobs/{job_id}/")
    progress = job.get("progress") or {}
    return {
        "id": job["id"], "name": job["name"], "phase": job["phase"],
        "step": job.get("current_step", 0),
        "max_steps": (job.get("hyperparameters") or {}).get("max_steps"),
        "loss": latest_loss(client, job_id),
        "tokens_per_s": progress.get("tokens_per_s"),
        "samples_per_s": progress.get("samples_per_s"),
        "pending_reason": job.get("pending_reason") or "",
        "waiting": output.waiting_reason(job),
        "last_error": job.get("last_error") or "",
    }


def render(s: dict) -> str:
    total = s["max_steps"]
    if total:
        done = min(BAR, int(BAR * s["step"] / total))
        pct = min(100, 100 * s["step"] // total)
        bar = f"[{'#' * done}{'-' * (BAR - done)}] {s['step']}/{total} {pct:3d}%"
    else:
        bar = f"step {s['step']}"
    parts = [bar, s["phase"]]
    if s["loss"] is not None:
        parts.append(f"loss {s['loss']:.4f}")
    if s["tokens_per_s"]:
        parts.append(f"{s['tokens_per_s']:,.0f} tok/s")
    elif s["samples_per_s"]:
        parts.append(f"{s['samples_per_s']:,.1f} samples/s")
    if s["waiting"]:
        parts.append(f"waiting: {s['waiting']}")
    return "  ".join(parts)


def watch_job(client: Client, job_id: int, interval: float, as_json: bool) -> int:
    tty = sys.stdout.isatty() and not as_json
    last_line, misses = None, 0
    while True:
        try:
            s = snapshot(client, job_id)
            misses = 0
        except CliError:
            misses += 1
            if misses >= MAX_MISSES:
                raise
            time.sleep(interval)
            continue
        except ApiError as exc:
            if exc.status < 500 or misses + 1 >= MAX_MISSES:
                raise
            misses += 1
            time.sleep(interval)
            continue
        if as_json:
            click.echo(json.dumps(s, sort_keys=True))
        else:
            line = render(s)
            if tty:
                click.echo("\r\033[K" + output.clean(line), nl=False)
            elif line != last_line:
                output.echo(line)
            last_line = line
        if s["phase"] in TERMINAL:
            if tty:
                output.echo()
            if not as_json:
                verdict = f"Job {s['id']} {s['name']} {s['phase']} at step {s['step']}."
                if s["phase"] == "failed" and s["last_error"]:
                    verdict += f" {s['last_error']}"
                output.secho(verdict, fg="green" if s["phase"] == "succeeded" else "red")
            return TERMINAL[s["phase"]]
        time.sleep(interval)
