"""Config and the HTTP client the CLI commands share."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import requests

DEFAULT_CONFIG = Path("~/.config/regatta/config.json")
API_PREFIX = "/api/v1/"
TIMEOUT_S = 30
# Lists are paginated; following `next` stops here so a huge timeline cannot
# keep a terminal busy for minutes.
MAX_PAGES = 50
CHUNK = 1 << 20


class CliError(Exception):
    """Something the user must fix (no config, unreachable server)."""


class ApiError(Exception):
    """The API answered with an error: kept as it gave it."""

    def __init__(self, status: int, reason: str, body):
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason, self.body = status, reason, body


@dataclass
class Config:
    url: str
    token: str


def config_path(path: str | None) -> Path:
    return Path(path).expanduser() if path else DEFAULT_CONFIG.expanduser()


def save_config(path: Path, url: str, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # The token is a credential: readable by its owner only, from the first byte.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url.rstrip("/"), "token": token}, fh, indent=2)
    os.chmod(path, 0o600)


def load_config(path: Path) -> Config:
    """The config file, with REGATTA_API_URL / REGATTA_API_TOKEN taking precedence."""
    stored = {}
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CliError(f"{path} is not valid JSON ({exc}); run `regatta login` again") from None
    url = os.environ.get("REGATTA_API_URL") or stored.get("url")
    token = os.environ.get("REGATTA_API_TOKEN") or stored.get("token")
    if not url or not token:
        raise CliError(
            f"not logged in: run `regatta login --url URL --token TOKEN` (config: {path}) "
            "or set REGATTA_API_URL and REGATTA_API_TOKEN"
        )
    return Config(url=url.rstrip("/"), token=token)


class Client:
    def __init__(self, config: Config, session: requests.Session | None = None):
        self.config = config
        self.session = session or requests.Session()
        self.session.headers.update({
            "Authorization": f"Bearer {config.token}", "Accept": "application/json",
        })

    def url(self, path: str) -> str:
        if path.startswith("http://") or path.startswith("https://"):
            return path
        return self.config.url + API_PREFIX + path.lstrip("/")

    def request(self, method: str, path: str, **kw):
        try:
            resp = self.session.request(method, self.url(path), timeout=TIMEOUT_S, **kw)
        except requests.RequestException as exc:
            raise CliError(f"cannot reach {self.config.url}: {exc}") from None
        try:
            body = resp.json() if resp.content else None
        except ValueError:
            body = resp.text
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, resp.reason or "", body)
        return body

    def get(self, path: str, **params):
        return self.request("GET", path, params={k: v for k, v in params.items() if v})

    def post(self, path: str, body=None):
        return self.request("POST", path, json=body if body is not None else {})

    def get_all(self, path: str, **params) -> list:
        """Every item of a list endpoint, following `next` links."""
        page = self.get(path, **params)
        if isinstance(page, list):
            return page
        items = list(page.get("results", []))
        for _ in range(MAX_PAGES - 1):
            if not page.get("next"):
                break
            page = self.request("GET", page["next"])
            items.extend(page.get("results", []))
        return items

    def download(self, path: str, dest: Path) -> tuple[int, str]:
        """Stream a file endpoint into `dest` (through `dest.partial`, renamed
        once complete); returns (bytes, sha256 of what arrived)."""
        partial = dest.with_name(dest.name + ".partial")
        try:
            resp = self.session.get(self.url(path), stream=True, timeout=TIMEOUT_S,
                                    headers={"Accept": "application/octet-stream, */*"})
        except requests.RequestException as exc:
            raise CliError(f"cannot reach {self.config.url}: {exc}") from None
        with resp:
            if resp.status_code >= 400:
                try:
                    body = resp.json()
                except ValueError:
                    body = resp.text
                raise ApiError(resp.status_code, resp.reason or "", body)
            digest, size = hashlib.sha256(), 0
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(partial, "wb") as fh:
                    for chunk in resp.iter_content(CHUNK):
                        fh.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
            except requests.RequestException as exc:
                partial.unlink(missing_ok=True)
                raise CliError(f"the download of {path} broke off: {exc}") from None
        os.replace(partial, dest)
        return size, digest.hexdigest()
