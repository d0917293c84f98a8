"""`regatta profile` and `regatta profiles`: profiling on demand from a
terminal (docs/cli.md). The click commands live in cli/main.py; what they do
with the API lives here."""

from __future__ import annotations

from pathlib import Path

from .client import Client, CliError


def ask(client: Client, job_id: int, steps: int) -> dict:
    """Ask the running job to profile its next `steps` steps (the pending
    request comes back while one is under way)."""
    return client.post(f"jobs/{job_id}/profile/", {"steps": steps})


def traces(client: Client, job_id: int, request_id: str | None = None,
           newest: bool = False) -> list[dict]:
    """The job's traces; only one profile's (`request_id`, or the newest)."""
    if request_id is None and newest:
        # The listing is newest first: its first row names the newest profile.
        first = client.get(f"jobs/{job_id}/profiles/", limit=1)["results"]
        request_id = first[0]["request_id"] if first else None
        if request_id is None:
            return []
    found = client.get_all(f"jobs/{job_id}/profiles/", request_id=request_id)
    return sorted(found, key=lambda t: (t["start_step"], t["request_id"], t["rank"]))


def local_path(out: Path, rel: str) -> Path:
    """Where a trace goes under `out` (its folder and name in the job's
    storage, less `profiles/`); a path that would leave `out` is refused."""
    parts = rel.removeprefix("profiles/").split("/")
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise CliError(f"refusing the file path {rel!r} from the server")
    return out.joinpath(*parts)


def download(client: Client, found: list[dict], out: Path) -> list[dict]:
    """Each trace into `out`, its size checked against the listing."""
    done = []
    for t in found:
        dest = local_path(out, t["path"])
        size, digest = client.download(t["url"], dest)
        if size != t["bytes"]:
            dest.unlink(missing_ok=True)
            raise CliError(f"{t['path']}: got {size} bytes, expected {t['bytes']}; deleted it")
        done.append({"rank": t["rank"], "start_step": t["start_step"], "steps": t["steps"],
                     "request_id": t["request_id"], "local": str(dest), "bytes": size,
                     "sha256": digest})
    return done
