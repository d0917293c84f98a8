"""Typed readers for environment variables.

Every setting comes from the environment through these helpers; a bad value
stops the process at start with a message that names the variable.
"""

import ipaddress
import os
import posixpath
import re
from pathlib import Path


class ImproperlyConfiguredEnv(ValueError):
    pass


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(name: str, default: str | None = None) -> str | None:
    value = _raw(name)
    return default if value is None else value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfiguredEnv(f"{name} must be at least {minimum}, got {number}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name} must be a number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfiguredEnv(f"{name} must be at least {minimum}, got {number}")
    return number


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    value = _raw(name)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name} must be one of true/false/1/0/yes/no, got {value!r}")


def env_choice(name: str, default: str, *, choices: tuple[str, ...]) -> str:
    """One of `choices`, compared without regard to case."""
    value = _raw(name)
    if value is None:
        return default
    by_upper = {choice.upper(): choice for choice in choices}
    if value.upper() not in by_upper:
        raise ImproperlyConfiguredEnv(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return by_upper[value.upper()]


_RATE = re.compile(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)")


def env_rate(name: str, default: str) -> str:
    """A request rate as Django REST Framework's throttles read it: `10/min`."""
    value = _raw(name)
    if value is None:
        return default
    if not _RATE.fullmatch(value.strip()):
        raise ImproperlyConfiguredEnv(
            f"{name} must be a count per second, minute, hour or day, e.g. 10/min; got {value!r}")
    return value.strip()


def parse_host_port(value: str) -> str:
    """`host:port` (an IPv6 host in brackets); raises ValueError saying why."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError("must be host:port, e.g. 127.0.0.1:8000")
    if host.startswith("[") != host.endswith("]") or any(c.isspace() for c in host):
        raise ValueError(f"has a malformed host {host!r}")
    if ":" in host and not host.startswith("["):
        raise ValueError("must put an IPv6 host in brackets, e.g. [::1]:8000")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"must end in a port between 1 and 65535, got {port!r}")
    return value


def reachable_url(bind: str) -> str:
    """The http URL that reaches a server bound at `bind` from this machine: a
    wildcard address (0.0.0.0, [::]) is reached on the loopback."""
    host, _, port = bind.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
    return f"http://{host}:{port}"


def env_host_port(name: str, default: str) -> str:
    value = _raw(name)
    if value is None:
        return default
    try:
        return parse_host_port(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name} {exc}, got {value!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_path(name: str, default: Path) -> Path:
    value = _raw(name)
    return Path(value).expanduser().resolve() if value else default


def env_url(name: str, default: str | None, *, schemes: tuple[str, ...]) -> str | None:
    value = _raw(name)
    if value is None:
        return default
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in schemes:
        raise ImproperlyConfiguredEnv(
            f"{name} must start with one of {', '.join(s + '://' for s in schemes)}, got {value!r}"
        )
    return value


_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def parse_storage_root(value: str) -> str:
    """An absolute path (or file:///path) or s3://bucket[/prefix], in one
    canonical spelling: a plain normalised path, or s3://bucket/prefix with
    no slash at either end of the prefix. Raises ValueError saying why."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must not contain control characters")
    if value.startswith("s3://"):
        bucket, _, prefix = value[len("s3://"):].partition("/")
        if not _S3_BUCKET.match(bucket):
            raise ValueError(f"has no valid S3 bucket name in {value!r}")
        parts = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"must not have . or .. in its S3 prefix: {value!r}")
        return "/".join([f"s3://{bucket}", *parts])
    path = value[len("file://"):] if value.startswith("file://") else value
    if not path.startswith("/"):
        raise ValueError(f"must be an absolute path, file:///path or s3://bucket/prefix: {value!r}")
    return "/" + posixpath.normpath(path).lstrip("/")


def env_storage_roots(name: str) -> list[str]:
    """Comma-separated storage roots (see parse_storage_root); empty if unset."""
    roots = []
    for item in env_list(name, []):
        try:
            roots.append(parse_storage_root(item))
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: each root {exc}") from None
    return roots


def env_networks(name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated networks in CIDR form (a bare address is its own /32
    or /128); empty if unset."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfiguredEnv(
                f"{name}: each item must be a network such as 10.0.0.0/8 or ::1, got {item!r}"
            ) from None
    return networks
