"""The worker package (`regatta` SDK + built-in trainer) as images install
it: a regular (not editable) install of worker_image/, the torch the worker
image pins, and no hard dependency (a training image keeps its own torch)."""

import inspect
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # builds and installs wheels

ROOT = Path(__file__).resolve().parents[2]
WORKER_IMAGE = ROOT / "worker_image"
SITE_PACKAGES = sysconfig.get_paths()["purelib"]  # torch and friends


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    # Built from a copy: setuptools writes build/ and egg-info beside the sources.
    src = tmp_path_factory.mktemp("src")
    shutil.copy(WORKER_IMAGE / "pyproject.toml", src)
    for package in ("regatta", "trainer"):
        shutil.copytree(WORKER_IMAGE / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-v", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = out.glob("regatta_worker-*.whl")
    return built, proc.stdout + proc.stderr


def test_the_wheel_ships_the_corpus_and_builds_without_package_warnings(wheel):
    built, build_log = wheel
    names = zipfile.ZipFile(built).namelist()

    assert "trainer/corpus/shakespeare.txt.gz" in names
    assert "trainer/corpus/SOURCE.md" in names
    # What a node runs beside its ranks (the local and Slurm fleets start it).
    assert {"regatta/node/launcher.py", "regatta/node/standby.py"} <= set(names)
    assert "absent from the `packages` configuration" not in build_log


def test_an_installed_trainer_reads_its_corpus(wheel, tmp_path):
    built, _ = wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--target", str(tmp_path / "site"), str(built)], check=True,
                   capture_output=True, timeout=120)
    # torch and friends from this environment, the trainer only from the wheel
    # (the editable install's import hook lives in a .pth, which PYTHONPATH skips).
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{SITE_PACKAGES}"}
    probe = ("import trainer.data as d, trainer.trainer, regatta.run, regatta.checkpoint; "
             "print(d.__file__); print(len(d.corpus_bytes()))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)

    assert proc.returncode == 0, proc.stderr[-3000:]
    where, size = proc.stdout.split()
    assert where.startswith(str(tmp_path / "site")) and int(size) == 5_057_281


def test_the_image_installs_the_torch_the_makefile_pins_and_the_package_admits_it():
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # The control plane installs no torch; the local fleet's ranks get the
    # version the Makefile pins.
    assert not [d for d in project["project"]["dependencies"] if d.startswith("torch")]
    pinned = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    dockerfile = (WORKER_IMAGE / "Dockerfile").read_text()
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(pinned)}$", dockerfile, re.M)
    worker = tomllib.loads((WORKER_IMAGE / "pyproject.toml").read_text())
    extra = worker["project"]["optional-dependencies"]["trainer"]
    (spec,) = [d for d in extra if d.startswith("torch")]
    assert pinned in SpecifierSet(spec.removeprefix("torch"))
    assert "2.8.0" not in SpecifierSet(spec.removeprefix("torch"))  # no DefaultStager there


def test_this_torch_has_the_checkpoint_apis_the_sdk_uses():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.distributed.tensor import DTensor

    assert "async_stager" in inspect.signature(dcp.async_save).parameters
    assert {"stage", "close"} <= set(dir(AsyncStager)) and Stateful
    # regatta/staging.py swaps a staged DTensor's local shard for its buffer.
    assert "_local_tensor" in DTensor.__slots__ or hasattr(DTensor, "_local_tensor")


def test_the_package_declares_no_hard_dependency_so_pip_never_swaps_an_images_torch():
    worker = tomllib.loads((WORKER_IMAGE / "pyproject.toml").read_text())

    assert worker["project"]["name"] == "regatta-worker"
    assert worker["project"]["dependencies"] == []
    assert set(worker["project"]["optional-dependencies"]) == {"trainer", "s3", "gpu"}


def test_the_wheel_ships_the_sdk_beside_the_trainer(wheel):
    built, _ = wheel
    names = zipfile.ZipFile(built).namelist()

    for module in ("__init__", "run", "storage", "manifest", "reporting", "preflight"):
        assert f"regatta/{module}.py" in names
    assert not any(n.startswith("trainer/storage") or n.startswith("trainer/manifest")
                   for n in names)  # moved, not copied
