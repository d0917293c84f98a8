"""The README's configuration table tells the truth about settings.py: every
variable it reads is listed, and the defaults shown are the code's."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "controlplane" / "settings.py"


def env_calls() -> dict[str, ast.Call]:
    """Each environment variable settings.py reads, with the call reading it."""
    calls = {}
    for node in ast.walk(ast.parse(SETTINGS.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id.startswith("env_") and node.args
                and isinstance(node.args[0], ast.Constant)):
            calls.setdefault(node.args[0].value, node)
    return calls


def table() -> dict[str, str]:
    """variable → its default cell, from the README's configuration table."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {m[1]: m[2].strip() for m in re.finditer(r"^\| `([A-Z_]+)` \|([^|]*)\|", section,
                                                     re.MULTILINE)}


def test_every_variable_settings_reads_is_in_the_table():
    assert len(env_calls()) >= 19
    assert set(env_calls()) - set(table()) == set()


def test_the_table_lists_no_variable_that_is_not_read():
    # A row for a variable nothing reads misleads as much as a missing row.
    assert set(table()) - set(env_calls()) == set()


def test_the_allowed_hosts_default_is_the_codes():
    default = ast.literal_eval(env_calls()["ALLOWED_HOSTS"].args[1])
    assert table()["ALLOWED_HOSTS"] == "`" + ",".join(default) + "`"


def test_the_numeric_defaults_are_the_codes():
    for name, call in env_calls().items():
        if call.func.id in ("env_int", "env_float"):
            default = ast.literal_eval(call.args[1])
            shown = table()[name].strip("`")
            assert float(shown) == default, (name, shown, default)
