"""Typed settings read from a JSON object (a cluster's or a pool's
`settings`), checked once and then read as attributes.

A settings class is a frozen dataclass whose fields are declared with
`setting(default, help, ...)`. `parse(cls, raw)` takes the keys the class
declares, checks each value against its type (bool, int, float, str, a list
of strings, an object of strings, any JSON object) and its bounds or
choices, and raises `SettingsError` naming every bad key at once. Keys the
class does not declare are left for the caller: a cluster's settings are
read by a common class and by its provider's own class (clusters/settings.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from .errors import PermanentError


class SettingsError(PermanentError):
    """Bad settings; `problems` maps each bad key to what is wrong with it."""

    def __init__(self, where: str, problems: dict[str, str]):
        self.where, self.problems = where, problems
        super().__init__("; ".join(f"{where} setting {k!r} {v}" for k, v in problems.items()))


def setting(default, help: str, *, choices=None, minimum=None, normalize=None):
    """A settings field. `normalize(value)` runs before the type check (e.g.
    to accept `true` for a mode name); `minimum` bounds numbers; `choices`
    bounds strings."""
    meta = {"help": help, "choices": choices, "minimum": minimum, "normalize": normalize}
    if isinstance(default, dict | list | tuple):
        frozen = tuple(default) if isinstance(default, list | tuple) else dict(default)
        return dataclasses.field(default_factory=lambda: type(frozen)(frozen), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def keys(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def parse(cls, raw: dict[str, Any] | None, *, where: str = "cluster"):
    """An instance of `cls` from the keys of `raw` it declares."""
    raw = raw or {}
    hints = typing.get_type_hints(cls)
    values, problems = {}, {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name not in raw:
            continue
        try:
            values[f.name] = _check(f, hints[f.name], raw[f.name], f.name)
        except ValueError as exc:
            problems[f.name] = str(exc)
    if problems:
        raise SettingsError(where, problems)
    return cls(**values)


def describe(cls) -> list[tuple[str, str, Any]]:
    """(key, help, default) for docs."""
    out = []
    for f in dataclasses.fields(cls):
        if f.init:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((f.name, f.metadata.get("help", ""), default))
    return out


def _check(f, hint, value, name):
    meta = f.metadata
    if meta.get("normalize") is not None:
        value = meta["normalize"](value)
    value = _typed(hint, value, " of seconds" if name.endswith("_s") else "")
    if meta.get("minimum") is not None and value is not None and value < meta["minimum"]:
        raise ValueError(f"must be at least {meta['minimum']}, not {value!r}")
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ValueError(f"is {value!r}; one of {tuple(meta['choices'])}")
    return value


def _typed(hint, value, unit=""):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return _SCALARS[hint](value, unit)
    if origin is tuple:
        return _string_list(value)
    if origin is dict and args == (str, str):
        return _string_dict(value)
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object")
        return dict(value)
    raise TypeError(f"settings of type {hint!r} are not supported")


def _bool(value, unit):
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _int(value, unit):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number{unit}, not {value!r}")
    return value


def _float(value, unit):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a number, not {value!r}")
    return float(value)


def _str(value, unit):
    if not isinstance(value, str):
        raise ValueError(f"must be a string, not {value!r}")
    return value


_SCALARS = {bool: _bool, int: _int, float: _float, str: _str}


def _string_list(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a list of strings")
    return tuple(value)


def _string_dict(value) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError("must be an object of strings")
    return {k: str(v) for k, v in value.items()}
