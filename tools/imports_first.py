"""No module-level import after a module's first function or class.

An import placed at a module's end (or below its definitions) loads late,
after the module's names exist, which is how a circle of imports is hidden
from the interpreter: moved to the top, it fails with "partially initialized
module". import-linter's acyclic_siblings contract (pyproject.toml) sees the
circle only if the import is there to see; this check sees the dodge.
Run by `make lint`; prints each offending import and exits 1.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("controlplane", "accounts", "clusters", "jobs", "checkpoints", "notifications",
            "frontend", "cli", "worker_image/regatta", "worker_image/trainer")


def late_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    seen_definition = False
    lines = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            seen_definition = True
        elif isinstance(node, ast.Import | ast.ImportFrom) and seen_definition:
            lines.append(node.lineno)
    return lines


def main(root: Path) -> int:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            found += [f"{path.relative_to(root)}:{line}" for line in late_imports(path)]
    for where in found:
        print(f"{where}: import below the module's definitions (move it to the top; if that "
              "makes a circle, break the circle)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parents[1]))
