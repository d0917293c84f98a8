"""Every path the docs cite exists: docs/*.md, README.md, and the docstrings
of the product's packages.

A cited path is a word like `clusters/reconcile/follow.py`,
`tests/jobs/test_api_jobs.py` or `worker_image/regatta/` (a folder ends
with a slash). It is read as this repository's when it starts at one of its
top-level entries (then it must exist from the root; `regatta/` and
`trainer/` from `worker_image/`), or at the name of one of its folders
(then some file or folder must end with it, as `views/fast.py` ends
`jobs/worker_api/views/fast.py`). Anything else is a path of the reader's or
of a checkpoint's own (`configs/run.yaml`, `step-200/manifest.json`) and is
not checked, nor is a URL, an API path after its method (`GET jobs/...`),
an absolute path or a bare file name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "accounts", "clusters", "jobs", "checkpoints", "notifications",
            "frontend", "cli", "worker_image/regatta", "worker_image/trainer")
SKIPPED = {".git", ".venv", "node_modules", "__pycache__", "test-artifacts", "staticfiles",
           ".regatta", ".pytest_cache", ".ruff_cache", ".hypothesis"}
# Under worker_image/, the two import packages, cited as `regatta/...`, `trainer/...`.
WORKER_ROOTS = ("regatta", "trainer")
EXTENSIONS = ("py", "md", "toml", "yaml", "yml", "json", "sh", "txt", "txt.gz", "cfg", "ini",
              "html", "js", "css", "go", "mod")
# A path: two or more words joined by slashes, not inside a URL, an absolute
# path or a longer word.
_PATH = re.compile(r"(?<![\w./:~…@$-])((?:[\w][\w.-]*/)+(?:[\w][\w.-]*)?)(?![\w/*<{-])")
_API_PATH = re.compile(r"\b(?:GET|POST|PUT|PATCH|DELETE|HEAD) `?$")


def _tree() -> tuple[set[str], set[str]]:
    """Every file and folder of the repository (relative, '/'-joined)."""
    files, folders = set(), set()
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for entry in folder.iterdir():
            if entry.name in SKIPPED or entry.name.endswith(".egg-info"):
                continue
            rel = entry.relative_to(ROOT).as_posix()
            if entry.is_dir():
                folders.add(rel)
                stack.append(entry)
            else:
                files.add(rel)
    return files, folders


def _sources() -> list[tuple[str, str]]:
    """(where, text): each doc, and each docstring of the product's modules."""
    out = [(p.relative_to(ROOT).as_posix(), p.read_text())
           for p in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]]
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts or SKIPPED & set(path.parts):
                continue
            where = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), where)):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    text = ast.get_docstring(node, clean=False)
                    if text:
                        out.append((where, text))
    return out


def cited(text: str) -> list[str]:
    found = []
    for m in _PATH.finditer(text):
        path = m.group(1)
        if _API_PATH.search(text, max(0, m.start() - 8), m.start()):
            continue
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if path.endswith("/") or any(last.endswith("." + ext) for ext in EXTENSIONS):
            found.append(path)
    return found


def missing_paths() -> dict[str, set[str]]:
    files, folders = _tree()
    top = {p for p in files | folders if "/" not in p}
    folder_names = {p.rsplit("/", 1)[-1] for p in folders}
    everything = files | folders

    def exists(path: str) -> bool:
        bare = path.rstrip("/")
        first = bare.split("/", 1)[0]
        if first in top:
            return bare in everything
        if first in WORKER_ROOTS:
            return f"worker_image/{bare}" in everything
        if first in folder_names:
            return any(p == bare or p.endswith("/" + bare) for p in everything)
        return True  # not a path of this repository

    missing: dict[str, set[str]] = {}
    for where, text in _sources():
        for path in cited(text):
            if not exists(path):
                missing.setdefault(path, set()).add(where)
    return missing


def test_every_path_the_docs_and_docstrings_cite_exists():
    missing = missing_paths()
    assert not missing, "cited paths that do not exist:\n" + "\n".join(
        f"  {path}  (cited in {', '.join(sorted(where))})"
        for path, where in sorted(missing.items()))


def test_the_check_reads_the_kinds_of_paths_the_docs_cite():
    """The reader of citations itself: a path in prose, a folder, and what
    is not a citation."""
    text = ("see clusters/reconcile/follow.py and `tests/jobs/test_api_jobs.py`; the SDK "
            "(worker_image/regatta/), not launcher.py, https://x.io/a/b.py, /tmp/a/b.py, "
            "<fleet>/attempts/x.json or `GET jobs/compare/`")
    assert cited(text) == ["clusters/reconcile/follow.py", "tests/jobs/test_api_jobs.py",
                           "worker_image/regatta/"]
