"""Typed readers for environment variables.

Every setting comes from the environment through these helpers; a bad value
stops the process at start with a message that names the variable.
"""

import os
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
