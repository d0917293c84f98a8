"""`regatta compare` and `regatta tensorboard`: run comparison and the
TensorBoard export from a terminal (docs/cli.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from . import output
from .base import State, json_flag


def _cell(value) -> str:
    if value is None:
        return "-"
    return output.truncate(value if isinstance(value, str) else json.dumps(value), 30)


@click.command()
@click.argument("job_ids", type=click.IntRange(1), nargs=-1, required=True)
@click.option("--metric", help="The metric to compare (default loss, or the first reported).")
@click.option("--all", "show_all", is_flag=True,
              help="List every hyperparameter and spec field, not only those that differ.")
@json_flag
def compare(state: State, job_ids: tuple[int, ...], metric: str | None, show_all: bool):
    """Compare jobs: each one's last value and curve of a metric, then the
    hyperparameters and spec fields whose values differ."""
    body = state.client.get("jobs/compare/", jobs=",".join(map(str, job_ids)), metric=metric)
    if state.as_json:
        output.emit_json(body)
        return
    jobs = body["jobs"]
    rows = [[j["id"], output.truncate(j["name"], 24), j["team"], j["phase"],
             output.number(j["last"]["value"]) if j["last"] else "-",
             j["last"]["step"] if j["last"] else "-",
             output.sparkline(j["y"], width=30) if j["y"] else "(no points)"] for j in jobs]
    output.table(rows, ["ID", "NAME", "TEAM", "PHASE", f"LAST {body['metric']}", "AT STEP",
                        "CURVE"])
    output.echo()
    params = body["params"] if show_all else [p for p in body["params"] if p["differs"]]
    if not params:
        output.echo("Hyperparameters and spec: no differences.")
        return
    output.table([[p["key"], *(_cell(v) for v in p["values"])] for p in params],
                 ["KEY", *(f"#{j['id']}" for j in jobs)])


@click.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The log folder: the file goes to OUT/job-ID/, for `tensorboard --logdir OUT`.")
@json_flag
def tensorboard(state: State, job_id: int, out: Path):
    """Export every metric point of a job as a TensorBoard event file."""
    run_dir = out.absolute() / f"job-{job_id}"
    # The name TensorBoard looks for (`tfevents`), as the API spells it.
    dest = run_dir / f"events.out.tfevents.{int(time.time())}.regatta-job-{job_id}"
    size, digest = state.client.download(f"jobs/{job_id}/metrics/tensorboard/", dest)
    if state.as_json:
        output.emit_json({"job": job_id, "file": str(dest), "bytes": size, "sha256": digest})
        return
    output.echo(f"Wrote {output.size(size)} of job {job_id}'s metrics to {dest}")
    output.echo(f"View them with: tensorboard --logdir {out.absolute()}")
