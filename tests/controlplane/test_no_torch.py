"""The control plane runs without torch: its package and image install none
(the worker image consolidates models and runs the preflight collective).
Every module of the control plane imports, and the export copies a final
checkpoint's files, in a Python where `import torch` fails."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Django set up; `modules()` imports every module of the control plane in
# turn and yields each name once it is imported.
WALK = r'''
import importlib, os, pkgutil, sys, tempfile
os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
os.environ["REGATTA_STATE_DIR"] = tempfile.mkdtemp()
import django
django.setup()


def modules():
    for package in ("controlplane", "accounts", "clusters", "jobs", "checkpoints",
                    "notifications", "frontend", "cli"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            importlib.import_module(info.name)
            yield info.name
'''

SCRIPT = r'''
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
''' + WALK + r'''
from pathlib import Path

import pytest
seen = sum(1 for _ in modules())
from regatta import manifest as mf
from regatta.storage import open_storage
from checkpoints.export import _copy, exported_files
base = Path(tempfile.mkdtemp())
step = base / "step-7" / "export"
step.mkdir(parents=True)
(step / "model.pt").write_bytes(b"weights")
(step / "config.json").write_text("{}")
files = mf.hash_local_files(base / "step-7", ["export/model.pt", "export/config.json"])
fmt, chosen = exported_files({"files": files})
_copy(open_storage(str(base)), 7, chosen, base / "registry")
assert fmt == "torch" and (base / "registry" / "model.pt").read_bytes() == b"weights"
assert "torch" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
print("modules", seen)
'''


@pytest.mark.slow
def test_the_control_plane_imports_and_exports_without_torch():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split("modules")[1]) > 100


WALK_WITH_TORCH = WALK + r'''
importers = []
before = False
for name in modules():
    if not before and "torch" in sys.modules:
        importers.append(name)
    before = "torch" in sys.modules
print("torch imported by:", ", ".join(importers) or "none")
'''


@pytest.mark.slow
def test_no_control_plane_module_imports_torch_where_it_is_installed():
    """Where the local fleet's torch is installed beside the control plane
    (./run, this suite), web, worker, beat and every manage.py command
    would pay its import (2 to 4 CPU-seconds, some 300 MB) if any module
    pulled it in: tensorboardX's package did, through the metrics export."""
    import importlib.util

    assert importlib.util.find_spec("torch") is not None  # the suite's virtualenv has it
    result = subprocess.run([sys.executable, "-c", WALK_WITH_TORCH], cwd=ROOT,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "torch imported by: none", result.stdout
