"""The `regatta` command: submit and follow training jobs from a terminal.

Exit codes: 0 success; 1 the API refused (its status and messages are shown)
or could not be reached; 2 bad usage; `watch` adds 1 for a failed job and 3
for a cancelled one.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import click
import yaml

from . import output
from . import profiles as profiling
from .base import State, json_flag
from .client import Client, CliError, Config, save_config
from .compare import compare, tensorboard
from .watch import TERMINAL, watch_job
from .webhooks import webhooks


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", envvar="REGATTA_CONFIG_FILE", type=click.Path(dir_okay=False),
              help="Config file (default ~/.config/regatta/config.json).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def cli(ctx, config, as_json):
    """Regatta: submit distributed training jobs and follow them."""
    ctx.obj = State(config, as_json)


@cli.command()
@click.option("--url", required=True, help="The control plane, e.g. http://127.0.0.1:8000")
@click.option("--token", required=True, help="An API token (rgt_…) from the console or API.")
@json_flag
def login(state: State, url: str, token: str):
    """Check a token against the server and store it."""
    me = Client(Config(url=url.rstrip("/"), token=token)).get("me/")
    save_config(state.config_file, url, token)
    if state.as_json:
        output.emit_json({"config": str(state.config_file), "me": me})
        return
    teams = ", ".join(me.get("teams") or []) or "no team"
    role = " (operator)" if me.get("is_operator") else ""
    output.echo(f"Logged in to {url} as {me.get('username')}{role}; teams: {teams}.")
    output.echo(f"Saved to {state.config_file}")


def read_spec(path: Path) -> dict:
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise CliError(f"{path} must hold a mapping of job fields (name, cluster, num_nodes, …)")
    return spec


def resolve_entrypoint(spec: dict, folder: Path) -> list[tuple[str, str]]:
    """Make the entrypoint's relative paths absolute, against the job file's
    folder, so a spec submits the same from any directory.

    An element is resolved when it is a relative path (not starting with `-`,
    not a URL, not the module name right after `-m`) that names a file or a
    folder existing next to the job file. Everything else is left as written
    (`python`, `torchrun`, `--lr`, `0.1`). Returns the (before, after) pairs.
    """
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, list):
        return []
    changed, previous, resolved = [], None, []
    for item in entrypoint:
        if (isinstance(item, str) and item and previous != "-m" and not item.startswith("-")
                and "://" not in item and not os.path.isabs(item)
                and (folder / item).exists()):
            absolute = os.path.abspath(folder / item)
            changed.append((item, absolute))
            resolved.append(absolute)
        else:
            resolved.append(item)
        previous = item
    spec["entrypoint"] = resolved
    return changed


@cli.command()
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_flag
def submit(state: State, spec_file: Path):
    """Submit the job described in SPEC_FILE (YAML, the flat job spec).

    Relative paths in `entrypoint` that exist next to SPEC_FILE (train.py,
    configs/run.yaml) are sent as absolute paths, so the file submits the
    same from any directory."""
    spec = read_spec(spec_file)
    for before, after in resolve_entrypoint(spec, spec_file.parent):
        output.echo(f"entrypoint: {before} -> {after}", err=True)
    job = state.client.post("jobs/", spec)
    if state.as_json:
        output.emit_json(job)
        return
    output.echo(f"Submitted job {job['id']} {job['name']} ({job['phase']}) "
               f"to {job['cluster']}: {job['num_nodes']}x{job['gpus_per_node']} GPUs")


JOB_HEADERS = ["ID", "NAME", "TEAM", "CLUSTER", "PHASE", "STEP", "GPUS", "AGE", "REASON"]


def _job_row(job: dict) -> list:
    reason = output.waiting_reason(job) or (job.get("last_error") if job["phase"] == "failed"
                                            else "")
    return [job["id"], job["name"], job["team"], job["cluster"], job["phase"],
            job.get("current_step", 0), job.get("world_size"), output.age(job.get("created_at")),
            output.truncate(reason, 60)]


@cli.command(name="list")
@click.option("--team", help="Only this team's jobs.")
@click.option("--phase", type=click.Choice(["pending", "queued", "admitted", "starting",
                                            "running", "restarting", "succeeded", "failed",
                                            "cancelled"]))
@click.option("--cluster", help="Only jobs on this cluster.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0)
@json_flag
def list_jobs(state: State, team, phase, cluster, limit, offset):
    """List jobs you can see, newest first."""
    page = state.client.get("jobs/", team=team, phase=phase, cluster=cluster, limit=limit,
                            offset=offset)
    if state.as_json:
        output.emit_json(page)
        return
    output.table([_job_row(j) for j in page["results"]], JOB_HEADERS)
    shown = len(page["results"])
    # Lists that grow carry no `count` unless asked (docs/api.md, "Pagination").
    if page.get("next"):
        output.echo(f"({shown} shown; --offset {offset + shown} for more)")


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def show(state: State, job_id: int):
    """Show one job's spec and status."""
    job = state.client.get(f"jobs/{job_id}/")
    if state.as_json:
        output.emit_json(job)
        return
    progress = job.get("progress") or {}
    hp = job.get("hyperparameters") or {}
    step = f"{job.get('current_step', 0)}" + (f" / {hp['max_steps']}" if "max_steps" in hp else "")
    interval = job.get("checkpoint_interval_steps") or job.get("checkpoint_every_steps")
    policy = ("auto, from measured cost and failure rate"
              if job.get("checkpoint_policy") == "auto" else "fixed")
    lines = [
        ("Job", f"{job['id']} {job['name']}"),
        ("Team", job["team"]),
        ("Phase", job["phase"]),
        ("Waiting", output.waiting_reason(job)),
        ("Last error", job.get("last_error")),
        ("Placement", f"{job['num_nodes']} node(s) x {job['gpus_per_node']} GPU on "
                      f"{job['cluster']}/{job.get('pool') or '-'} "
                      f"(world size {job['world_size']})"),
        ("Strategy", job.get("strategy")),
        ("Step", step),
        ("Throughput", f"{progress['tokens_per_s']:.0f} tok/s" if progress.get("tokens_per_s")
         else None),
        ("Checkpoints", f"every {interval} steps ({policy}), keep {job.get('keep_last')}"),
        ("Restarts", output.restarts(job)),
        ("Evaluates", f"step {job['eval_step']} of job {job['parent']}"
         if job.get("parent") else None),
        ("Evaluation", _eval_policy(job.get("eval"))),
        ("Storage", job.get("storage_uri")),
        ("Submitted", f"{job.get('created_at')} by {job.get('created_by') or '-'}"),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        if value:
            output.echo(f"{key.ljust(width)}  {value}")


def _eval_policy(policy: dict | None) -> str | None:
    if not policy:
        return None
    which = ("every checkpoint" if policy.get("every_checkpoint")
             else f"every {policy.get('every_n_checkpoints')} checkpoints")
    return f"{which} on pool {policy.get('pool')} (`regatta evals`)"


@cli.command()
@click.argument("job_id", type=int)
@click.option("--interval", type=click.FloatRange(0.2, 60), default=2.0, show_default=True,
              help="Seconds between polls.")
@json_flag
def watch(state: State, job_id: int, interval: float):
    """Follow a job until it ends: step, loss, throughput.

    Exits 0 when it succeeds, 1 when it fails, 3 when it is cancelled."""
    sys.exit(watch_job(state.client, job_id, interval, state.as_json))


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def events(state: State, job_id: int):
    """The job's timeline: every transition and what caused it."""
    items = state.client.get_all(f"jobs/{job_id}/events/")
    if state.as_json:
        output.emit_json(items)
        return
    rows = []
    for e in items:
        move = f"{e['from_phase']}->{e['to_phase']}" if e["from_phase"] != e["to_phase"] else ""
        rows.append([e["created_at"][:19].replace("T", " "), e["kind"], move, e["actor"],
                     output.truncate(e.get("message"), 70)])
    output.table(rows, ["TIME", "KIND", "PHASE", "ACTOR", "MESSAGE"])


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def checkpoints(state: State, job_id: int):
    """The job's checkpoints, newest first."""
    items = state.client.get_all(f"jobs/{job_id}/checkpoints/")
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[c["step"], c["state"] + (" (emergency)" if c.get("emergency") else ""),
             output.size(c.get("bytes")), f"{c.get('save_seconds', 0):.2f}s",
             output.age(c.get("created_at")), c["uri"]]
            for c in sorted(items, key=lambda c: -c["step"])]
    output.table(rows, ["STEP", "STATE", "SIZE", "SAVE", "AGE", "URI"])


@cli.command(name="evals")
@click.argument("job_id", type=int)
@click.option("--samples", is_flag=True, help="Print each run's generated samples too.")
@json_flag
def eval_runs(state: State, job_id: int, samples: bool):
    """The job's eval runs, by checkpoint step: phase, val_loss, perplexity."""
    items = state.client.get(f"jobs/{job_id}/evals/")
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[e["eval_step"], e["id"], e["phase"], output.number(e["metrics"].get("val_loss")),
             output.number(e["metrics"].get("val_perplexity")), e.get("attempts", 0),
             output.truncate(e.get("pending_reason") or e.get("last_error"), 50)]
            for e in items]
    output.table(rows, ["STEP", "RUN", "PHASE", "VAL_LOSS", "PERPLEXITY", "ATTEMPTS", "NOTE"])
    if samples:
        for e in items:
            for s in e.get("samples") or []:
                output.echo(f"step {e['eval_step']}: {s.get('prompt', '')!r} -> "
                           f"{s.get('completion', '')!r}")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--steps", type=click.IntRange(1, 50), required=True,
              help="How many of the next steps every rank profiles.")
@json_flag
def profile(state: State, job_id: int, steps: int):
    """Profile the running job's next N steps with torch.profiler on every
    rank (one gzipped Chrome/Perfetto trace per rank; see `profiles`)."""
    asked = profiling.ask(state.client, job_id, steps)
    if state.as_json:
        output.emit_json(asked)
        return
    what = "requested" if asked["created"] else "already under way"
    output.echo(f"Profile of the next {asked['steps']} steps {what} on attempt "
               f"{asked['attempt']} (request {asked['request_id']}); fetch the traces with "
               f"`regatta profiles {job_id} --out DIR`.")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--request", "request_id", help="Only this profile's traces (its request id).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Download the traces into this folder (the newest profile's, or --request's).")
@json_flag
def profiles(state: State, job_id: int, request_id: str | None, out: Path | None):
    """The job's profiler traces, one per rank; with --out, download them."""
    found = profiling.traces(state.client, job_id, request_id, newest=out is not None)
    if out is not None:
        if not found:
            raise CliError(f"job {job_id} has no profiler traces yet")
        done = profiling.download(state.client, found, out.absolute())
        if state.as_json:
            output.emit_json({"job": job_id, "out": str(out.absolute()), "files": done})
            return
        for d in done:
            output.echo(f"rank {d['rank']}  {output.size(d['bytes'])}  {d['local']}")
        return
    if state.as_json:
        output.emit_json(found)
        return
    rows = [[t["id"], f"{t['start_step']}..{t['start_step'] + t['steps'] - 1}", t["rank"],
             output.size(t["bytes"]), output.age(t["created_at"]), t["request_id"]]
            for t in found]
    output.table(rows, ["ID", "STEPS", "RANK", "SIZE", "AGE", "REQUEST"])


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def cancel(state: State, job_id: int):
    """Ask for a job to stop (repeating it is harmless)."""
    job = state.client.post(f"jobs/{job_id}/cancel/")
    if state.as_json:
        output.emit_json(job)
        return
    output.echo(f"Cancel requested for job {job['id']} {job['name']} (now {job['phase']}).")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--from-step", "from_step", type=click.IntRange(0), required=True,
              help="The step of a committed or verified checkpoint (see `checkpoints`).")
@json_flag
def restart(state: State, job_id: int, from_step: int):
    """Restart the job's gang from the checkpoint at a chosen step; an ended
    job (succeeded, failed, cancelled) runs again from it as a new run."""
    ended = state.client.get(f"jobs/{job_id}/")["phase"] in TERMINAL
    job = state.client.post(f"jobs/{job_id}/restart/", {"from_step": from_step})
    if state.as_json:
        output.emit_json(job)
        return
    what = "Rerun" if ended else "Restart"
    output.echo(f"{what} of job {job['id']} {job['name']} from step {from_step} requested "
               f"(now {job['phase']}); follow it with `regatta watch {job['id']}`.")


@cli.command()
@click.option("--cluster", help="Only this cluster's nodes (name).")
@click.option("--pool", help="Only this pool's nodes.")
@click.option("--state", "node_state", help="Only nodes in this state (ready, cordoned, …).")
@json_flag
def nodes(state: State, cluster, pool, node_state):
    """The fleet's nodes and their state."""
    items = state.client.get_all("nodes/", cluster=cluster, pool=pool, state=node_state)
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[n["name"], n["cluster"], n["pool"], n["state"], n["gpus"],
             "spare" if n.get("is_spare") else "", output.truncate(n.get("state_reason"), 60)]
            for n in items]
    output.table(rows, ["NAME", "CLUSTER", "POOL", "STATE", "GPUS", "ROLE", "REASON"])


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def attempts(state: State, job_id: int):
    """The job's attempts: where each ran, how it ended, where it resumed from."""
    items = state.client.get_all(f"jobs/{job_id}/attempts/")
    if state.as_json:
        output.emit_json(items)
        return
    rows = []
    for a in sorted(items, key=lambda a: a["number"]):
        nodes = ",".join(n["node"] for n in sorted(a.get("nodes") or [],
                                                    key=lambda n: n["node_rank"]))
        resumed = a.get("resumed_from_step")
        rows.append([a["number"], a["state"], nodes or "-",
                     "-" if resumed is None else resumed, a.get("last_step", 0),
                     _time(a.get("started_at")), output.duration(_seconds(a)),
                     "-" if a.get("exit_code") is None else a["exit_code"],
                     a.get("failure_class") or "-",
                     output.truncate(a.get("failure_reason"), 50)])
    output.table(rows, ["#", "STATE", "NODES", "RESUMED", "STEP", "STARTED", "RAN", "EXIT",
                        "FAILURE", "REASON"])


def _time(iso: str | None) -> str:
    return iso[:19].replace("T", " ") if iso else "-"


def _seconds(attempt: dict) -> float | None:
    if not attempt.get("started_at"):
        return None
    start = datetime.fromisoformat(attempt["started_at"].replace("Z", "+00:00"))
    end = (datetime.fromisoformat(attempt["ended_at"].replace("Z", "+00:00"))
           if attempt.get("ended_at") else datetime.now(UTC))
    return max(0.0, (end - start).total_seconds())


@cli.command()
@click.argument("job_id", type=int)
@json_flag
def goodput(state: State, job_id: int):
    """Where the job's GPU time went: productive training and each kind of loss."""
    report = state.client.get(f"jobs/{job_id}/goodput/")
    if state.as_json:
        output.emit_json(report)
        return
    total = report["total"]["gpu_seconds"]
    rows = [[name, output.duration(c["seconds"]), f"{c['gpu_seconds'] / 3600:.2f}",
             f"{100 * c['gpu_seconds'] / total:.1f}%" if total else "-"]
            for name, c in report["categories"].items()]
    output.table(rows, ["CATEGORY", "TIME", "GPU-HOURS", "SHARE"])
    ratio = report.get("goodput_ratio")
    if ratio is None:
        output.echo("Goodput: no GPU time recorded yet.")
    else:
        output.echo(f"Goodput: {100 * ratio:.1f}% of {total / 3600:.2f} GPU-hours were "
                   "productive training.")


@cli.command()
@click.argument("job_id", type=int)
@click.option("--name", "names", multiple=True,
              help="A metric (repeatable); default every metric the job reported.")
@click.option("--last", type=click.IntRange(1, 5000), default=None,
              help="Steps to show (table default 10; --json default all).")
@json_flag
def metrics(state: State, job_id: int, names: tuple[str, ...], last: int | None):
    """The job's metrics: the last steps as a table and a sparkline of each
    whole series (downsampled by the API past 5000 steps)."""
    names = list(names) or state.client.get(f"jobs/{job_id}/metrics/names/")["names"]
    series = {n: state.client.get(f"jobs/{job_id}/metrics/", name=n, points=5000)
              for n in names}
    if state.as_json:
        output.emit_json({"job": job_id, "metrics": {
            n: {"total": s["total"], "points": s["points"][-last:] if last else s["points"]}
            for n, s in series.items()}})
        return
    if not any(s["points"] for s in series.values()):
        output.echo(f"Job {job_id} has reported no metrics yet.")
        return
    by_step: dict[int, dict[str, float]] = {}
    for n, s in series.items():
        for step, value in s["points"]:
            by_step.setdefault(int(step), {})[n] = value
    steps = sorted(by_step)[-(last or 10):]
    output.table([[step, *(output.number(by_step[step].get(n)) for n in names)]
                  for step in steps], ["STEP", *names])
    output.echo()
    width = max(len(n) for n in names)
    for n in names:
        points = series[n]["points"]
        if not points:
            output.echo(f"{n.ljust(width)}  (no points)")
            continue
        values = [v for _, v in points]
        low = min(points, key=lambda p: p[1])
        output.echo(f"{n.ljust(width)}  {output.sparkline(values)}  "
                   f"{output.number(values[0])} -> {output.number(values[-1])}, "
                   f"min {output.number(low[1])} at step {int(low[0])} "
                   f"({series[n]['total']} steps)")


@cli.command()
@click.option("--job", "job_id", type=int, help="Only this job's artifacts.")
@json_flag
def artifacts(state: State, job_id: int | None):
    """Exported models you can see, newest first (download with `regatta download ID`)."""
    items = state.client.get_all("artifacts/", job=job_id)
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[a["id"], a["name"], a["version"], a["job"], a["format"], output.size(a["bytes"]),
             (a.get("sha256") or "")[:12], output.age(a.get("created_at"))] for a in items]
    output.table(rows, ["ID", "NAME", "VERSION", "JOB", "FORMAT", "SIZE", "SHA256", "AGE"])


def _local_path(out: Path, rel: str) -> Path:
    """Where a listed file goes under `out`; a path that would leave it is refused."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise CliError(f"refusing the file path {rel!r} from the server")
    return out.joinpath(*parts)


@cli.command()
@click.argument("artifact_id", type=int)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write into (default ./NAME-vVERSION).")
@click.option("--file", "only", help="Only this file of the artifact, e.g. model.pt.")
@json_flag
def download(state: State, artifact_id: int, out: Path | None, only: str | None):
    """Download an exported model's files, checking each one's sha256.

    A file whose size or checksum differs from the listing is deleted and
    the command exits 1."""
    artifact = state.client.get(f"artifacts/{artifact_id}/")
    files = state.client.get(f"artifacts/{artifact_id}/files/")["files"]
    if only is not None:
        files = [f for f in files if f["path"] == only]
        if not files:
            raise CliError(f"artifact {artifact_id} has no file {only!r}; "
                           f"`regatta download {artifact_id}` fetches them all")
    if not files:
        raise CliError(f"artifact {artifact_id} has no files to download")
    out = (out or Path(f"{artifact['name']}-v{artifact['version']}")).absolute()
    done = []
    for f in files:
        dest = _local_path(out, f["path"])
        size, digest = state.client.download(
            f"artifacts/{artifact_id}/files/{quote(f['path'])}", dest)
        if size != f["bytes"] or (f["sha256"] and digest != f["sha256"]):
            dest.unlink(missing_ok=True)
            raise CliError(f"{f['path']}: got {size} bytes with sha256 {digest}, expected "
                           f"{f['bytes']} bytes with sha256 {f['sha256'] or '(not recorded)'}; "
                           "deleted it")
        done.append({"path": f["path"], "local": str(dest), "bytes": size, "sha256": digest,
                     "verified": bool(f["sha256"])})
        if not state.as_json:
            check = "sha256 ok" if f["sha256"] else "size ok (no checksum recorded)"
            output.echo(f"{f['path']}  {output.size(size)}  {check}")
    if state.as_json:
        output.emit_json({"artifact": artifact_id, "name": artifact["name"],
                          "version": artifact["version"], "out": str(out), "files": done})
        return
    output.echo(f"Downloaded artifact {artifact_id} {artifact['name']} v{artifact['version']} "
               f"({len(done)} file(s), {output.size(sum(d['bytes'] for d in done))}) to {out}")


cli.add_command(webhooks)
cli.add_command(compare)
cli.add_command(tensorboard)


def main(argv=None):
    cli.main(args=argv, prog_name="regatta")


if __name__ == "__main__":
    main()
