"""How the CLI prints: aligned tables for people, JSON for scripts, and API
errors exactly as the API gave them."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import click

# C0 controls but tab and newline, DEL and C1 controls: a name or message from
# the server holding ESC sequences (or a carriage return) could otherwise
# recolour, rewrite or hide what the terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """`text` with its control characters shown escaped (ESC as \\x1b)."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def echo(message="", **kwargs) -> None:
    """click.echo, with control characters in the text escaped."""
    click.echo(clean(str(message)), **kwargs)


def secho(message="", **kwargs) -> None:
    click.secho(clean(str(message)), **kwargs)


def emit_json(data) -> None:
    # json.dumps writes every control character as an escape already.
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(rows: list[list], headers: list[str]) -> None:
    cells = [[("" if c is None else clean(str(c))) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    secho(line.rstrip(), bold=True)
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def age(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    secs = max(0, int((datetime.now(UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def size(num) -> str:
    n = float(num or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TiB"


# Phases in which a job is on its way to running and may be held up.
WAITING_PHASES = ("pending", "queued", "admitted", "starting", "restarting")


def waiting_reason(job: dict, now: float | None = None) -> str:
    """Why a job that is not running yet (or again) waits, or "".

    The API's pending_reason covers the queue and a restart waiting for
    nodes; a restart backing off after a transient failure says so through
    its RestartBackoff condition (`until` is a Unix time).
    """
    if job.get("phase") not in WAITING_PHASES:
        return ""
    if job.get("pending_reason"):
        return job["pending_reason"]
    now = time.time() if now is None else now
    for cond in job.get("conditions") or []:
        until = cond.get("until") if isinstance(cond, dict) else None
        if cond.get("type") == "RestartBackoff" and isinstance(until, int | float) and until > now:
            return f"backing off after a transient failure; retrying in {until - now:.0f}s"
    return ""


def truncate(text: str | None, width: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def field_messages(body, prefix: str = "") -> list[str]:
    """Flatten DRF's error body into `field: message` lines."""
    if isinstance(body, dict):
        out = []
        for key, value in body.items():
            name = key if not prefix else f"{prefix}.{key}"
            if key in ("detail", "non_field_errors") and not prefix:
                out.extend(field_messages(value, ""))
            else:
                out.extend(field_messages(value, name))
        return out
    if isinstance(body, list):
        if all(not isinstance(v, dict | list) for v in body):
            text = " ".join(str(v) for v in body)
            return [f"{prefix}: {text}" if prefix else text]
        out = []
        for i, value in enumerate(body):
            out.extend(field_messages(value, f"{prefix}[{i}]" if prefix else f"[{i}]"))
        return out
    text = str(body)
    return [f"{prefix}: {text}" if prefix else text]


def api_error(exc, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"status": exc.status, "error": exc.body}, indent=2), err=True)
        return
    secho(f"Error: HTTP {exc.status} {exc.reason}".rstrip(), fg="red", err=True)
    if exc.body in (None, ""):
        return
    for line in field_messages(exc.body):
        echo(f"  {line}", err=True)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    """Unicode blocks, one per bucket of `values` (the bucket's mean), low to high."""
    values = [v for v in values if v is not None]
    if not values:
        return ""
    if len(values) > width:
        buckets = [values[i * len(values) // width:(i + 1) * len(values) // width]
                   for i in range(width)]
        values = [sum(b) / len(b) for b in buckets if b]
    low, high = min(values), max(values)
    if high == low:
        return SPARKS[len(SPARKS) // 2] * len(values)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - low) / (high - low) * top)] for v in values)


def number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()
                                  and abs(value) < 1e6):
        return str(int(value))
    return f"{value:.4g}"


def duration(seconds) -> str:
    if seconds is None:
        return "-"
    secs = int(round(float(seconds)))
    if secs < 60:
        return f"{float(seconds):.1f}s" if float(seconds) < 10 else f"{secs}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            rest = secs % size
            sub = {"d": 3600, "h": 60, "m": 1}[unit]
            return f"{secs // size}{unit}{rest // sub:02d}" + {"d": "h", "h": "m", "m": "s"}[unit]
    return f"{secs}s"  # pragma: no cover


def restarts(job: dict) -> str:
    """Per class: restarts charged to the job within its window / budget, and
    all restarts of this run when some were forgiven (charged to nodes)."""
    parts = []
    for cls, r in (job.get("restarts") or {}).items():
        part = f"{cls} {r['spent']}/{r['budget']}"
        if r.get("in_all"):
            part += f" ({r['in_all']} in all)"
        parts.append(part)
    return ", ".join(parts)
