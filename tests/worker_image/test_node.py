"""The node programs (worker_image/regatta/node/) start before anything else
on a node and are imported by a control plane without torch: at module
level they import the standard library, the worker contract and each
other, nothing more. What the standby needs of torch and the SDK it imports
inside its functions, in its own process."""

import ast
import sys
from pathlib import Path

import regatta.node

NODE = Path(regatta.node.__file__).parent
ALLOWED = {"regatta.contract"}


def module_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its top-level statements,
    including those under `if`/`try` blocks, not those in functions."""
    found = set()
    stack = list(ast.parse(path.read_text()).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):  # `from a import b`: a.b, module or name
            base = "." * node.level + (node.module or "")
            found.update(f"{base}.{alias.name}".replace("..", ".") for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return found


def foreign(name: str) -> bool:
    top = name.split(".")[0]
    if name.startswith(".") or top == "__future__" or top in sys.stdlib_module_names:
        return False
    return not (name in ALLOWED or name.startswith("regatta.node."))


def test_the_node_programs_import_only_the_standard_library_and_the_contract():
    modules = sorted(NODE.glob("*.py"))
    assert {m.name for m in modules} >= {"launcher.py", "standby.py", "procs.py", "files.py"}
    imports = {m.name: module_level_imports(m) for m in modules}
    assert "regatta.contract" in imports["procs.py"]  # the reader sees what it must
    assert {name: sorted(i for i in found if foreign(i))
            for name, found in imports.items()} == {m.name: [] for m in modules}


def test_the_reader_finds_imports_under_if_and_try_and_skips_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import os\n"
        "try:\n    import torch\nexcept ImportError:\n    import numpy\n"
        "if os.name:\n    from regatta import run\n"
        "def f():\n    import boto3\n")
    found = module_level_imports(source)
    assert found == {"os", "torch", "numpy", "regatta.run"}
    assert sorted(i for i in found if foreign(i)) == ["numpy", "regatta.run", "torch"]
