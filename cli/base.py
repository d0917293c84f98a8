"""What every `regatta` command shares: the state click passes (config and
the API client) and the `--json` flag with the error handling around it.
Apart from cli/main.py so command groups in other modules (cli/webhooks.py)
use them without importing main."""

from __future__ import annotations

import functools
import sys

import click

from . import output
from .client import ApiError, Client, CliError, config_path, load_config

EXIT_ERROR = 1


class State:
    def __init__(self, config: str | None, as_json: bool):
        self.config_file = config_path(config)
        self.as_json = as_json
        self._client = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(load_config(self.config_file))
        return self._client


def json_flag(fn):
    """`--json` on each command as well as before it: both spellings work."""

    @click.option("--json", "as_json", is_flag=True, default=False,
                  help="Print JSON for scripts instead of a table.")
    @click.pass_obj
    @functools.wraps(fn)
    def wrapper(state: State, *args, as_json: bool, **kwargs):
        state.as_json = state.as_json or as_json
        try:
            return fn(state, *args, **kwargs)
        except ApiError as exc:
            output.api_error(exc, state.as_json)
            sys.exit(EXIT_ERROR)
        except CliError as exc:
            output.secho(f"Error: {exc}", fg="red", err=True)
            sys.exit(EXIT_ERROR)

    return wrapper
