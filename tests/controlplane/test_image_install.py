"""The shipped control-plane image starts: what the Dockerfile copies is
enough for its `pip install` and for `manage.py migrate`, and the package
that install builds carries every app, migration, template and static file.

Nothing here runs Docker. The Dockerfile's COPY lines are read and carried
out into a folder (the image's /app), the two wheels its `pip install` makes
are built from that folder, and they are installed into a clean virtualenv
that sees no source tree. Their dependencies come from this environment's
site-packages, linked in one distribution at a time and only as far as the
control plane's declared requirements reach, so nothing is downloaded (no
torch: the control plane does not need it) and an undeclared dependency
still fails to import.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def copy_lines() -> list[tuple[list[str], str]]:
    """The Dockerfile's `COPY src... dest` instructions, in order."""
    copies = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            words = shlex.split(line)
            assert not any(w.startswith("--") for w in words), f"unhandled COPY flag: {line}"
            copies.append((words[1:-1], words[-1]))
    return copies


def local_apps() -> set[str]:
    """The project's own apps in INSTALLED_APPS (folders at the top of the repo)."""
    from django.conf import settings

    return {app.split(".")[0] for app in settings.INSTALLED_APPS
            if (ROOT / app.split(".")[0] / "__init__.py").exists()}


def packaged_tops() -> set[str]:
    """Top-level packages that pyproject.toml's package discovery takes in."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in include}


def test_the_dockerfile_copies_every_package_the_install_and_settings_need():
    copied = {src.rstrip("/") for sources, _ in copy_lines() for src in sources}
    # `pip install './worker_image[s3]' .` and `python manage.py ...`.
    needed = packaged_tops() | local_apps() | {"pyproject.toml", "README.md", "manage.py",
                                               "worker_image"}

    assert needed - copied == set()


def test_the_package_takes_in_every_installed_app():
    assert local_apps() - packaged_tops() == set()


# --- the image, built without Docker -------------------------------------------

def _build_context(app: Path) -> None:
    """Carry out the Dockerfile's COPY lines from the repository into `app`,
    as Docker does: a folder's contents go to the destination; a file goes
    into a destination that ends in `/`, or becomes it."""
    for sources, dest in copy_lines():
        target = app / dest
        for src in sources:
            path = ROOT / src
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
            elif dest.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target / path.name)
            else:
                shutil.copy(path, target)


def _requirement_closure(requirements: list[str]) -> set[str]:
    """Names of the installed distributions these requirements pull in."""
    seen: set[str] = set()
    todo = [(Requirement(r), set()) for r in requirements]
    while todo:
        req, _ = todo.pop()
        name = canonicalize_name(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        dist = md.distribution(req.name)
        for sub in dist.requires or ():
            sub_req = Requirement(sub)
            extras = req.extras or {""}
            if sub_req.marker is None or any(sub_req.marker.evaluate({"extra": e})
                                             for e in extras):
                todo.append((sub_req, set()))
    return {n for n in seen if "[" not in n}


def _link_distributions(names: set[str], site: Path) -> None:
    """Link each distribution's top-level files from this environment into
    `site`: packages, modules, its .dist-info, and nothing else."""
    for name in names:
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}
        for top in tops:
            if top == ".." or top.endswith(".pth") or top == "__pycache__":
                continue  # scripts, path hooks, bytecode caches
            src = SITE_PACKAGES / top
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    """The image's /app folder and a clean virtualenv holding what its
    `pip install './worker_image[s3]' .` installs."""
    app = tmp_path_factory.mktemp("app")
    _build_context(app)
    wheels = tmp_path_factory.mktemp("wheels")
    for src in (app / "worker_image", app):
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "-q", "-w", str(wheels), str(src)],
            capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
        / "site-packages"
    built = sorted(wheels.glob("*.whl"))
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--target", str(site), *map(str, built)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    project = tomllib.loads((app / "pyproject.toml").read_text())
    # The control plane's requirements and the worker package's [s3] extra,
    # as the Dockerfile asks for them.
    _link_distributions(_requirement_closure([*project["project"]["dependencies"], "boto3"]),
                        site)
    state = tmp_path_factory.mktemp("state")
    env = {"PATH": os.environ["PATH"], "HOME": str(state),
           "DJANGO_SETTINGS_MODULE": "controlplane.settings",
           "REGATTA_STATE_DIR": str(state), "SECRET_KEY": "k" * 20 + "-7Hq!x" + "z" * 40,
           "ALLOWED_HOSTS": "regatta.example.com", "PYTHONDONTWRITEBYTECODE": "1"}
    return {"app": app, "wheels": built, "python": str(venv / "bin" / "python"), "env": env,
            "site": site}


def _run(image, args, cwd, **env):
    return subprocess.run([image["python"], *args], cwd=cwd, env={**image["env"], **env},
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_the_wheel_carries_every_app_with_its_migrations_templates_and_static(image):
    (control_plane,) = [w for w in image["wheels"] if not w.name.startswith("regatta_worker")]
    names = set(zipfile.ZipFile(control_plane).namelist())
    expected = set()
    for top in packaged_tops() | local_apps():
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and "__pycache__" not in rel and (
                    path.suffix == ".py" or "/templates/" in rel or "/static/" in rel):
                expected.add(rel)

    assert expected - names == set()
    assert {f"{app}/migrations/0001_initial.py" for app in local_apps()
            if (ROOT / app / "migrations" / "0001_initial.py").exists()} <= names


@pytest.mark.slow
def test_the_installed_package_imports_every_app_checks_for_deploy_and_migrates(
        image, tmp_path):
    # An empty folder: nothing can come from a source tree, only from the install.
    probe = ("import django, importlib; django.setup(); from django.apps import apps; "
             "mods = [importlib.import_module(a.name) for a in apps.get_app_configs()]; "
             "import controlplane.wsgi, controlplane.celery, jobs.tasks; "
             "import torch")
    proc = _run(image, ["-c", probe], tmp_path)
    # Every app imports, and only then does the last import fail: the
    # control plane installs no torch.
    assert "No module named 'torch'" in proc.stderr, proc.stderr[-3000:]
    for args in (["check", "--deploy", "--fail-level", "ERROR"], ["migrate", "--noinput"],
                 ["collectstatic", "--noinput"], ["migrate", "--check"]):
        proc = _run(image, ["-m", "django", *args], tmp_path)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    assert (Path(image["env"]["REGATTA_STATE_DIR"]) / "static" / "frontend" / "job.js").exists()
    where = _run(image, ["-c", "import notifications, jobs; print(notifications.__file__); "
                               "print(jobs.__file__)"], tmp_path)
    for line in where.stdout.split():
        assert line.startswith(str(image["site"])), line


@pytest.mark.slow
def test_the_images_own_commands_run_in_its_app_folder(image, tmp_path):
    # What docker-compose's migrate service and deploy/'s migrate Job run, in /app.
    state = tmp_path / "state"
    for args in (["manage.py", "check", "--deploy", "--fail-level", "ERROR"],
                 ["manage.py", "migrate", "--noinput"]):
        proc = _run(image, args, image["app"], REGATTA_STATE_DIR=str(state))
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-3000:])
    assert re.search(r"^RUN pip install '\./worker_image\[s3\]' \. ", DOCKERFILE.read_text(),
                     re.M)
