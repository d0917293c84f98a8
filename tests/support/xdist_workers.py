"""Each pytest-xdist worker (`make test-fast` runs one per core, `make test
TEST_WORKERS=N` N) gets a state folder and a Redis database of its own, so
two workers never share a SQLite file, a broker database or a local fleet
folder; and the whole suite's workers share out its files the way the real
clusters allow.

Loaded as a plugin (`-p`, see pyproject.toml) because it must set the
environment before pytest-django reads the settings, which happens before
any conftest is imported. Without xdist it does nothing.

- The state folder is the run's folder plus the worker's name.
- A REDIS_URL given to the run names one database, which the suite empties
  at its start (tests/conftest.py): worker N takes the database N after it
  (modulo 16) on the same server. Without one, each worker starts the
  embedded Redis in its own folder. PostgreSQL needs nothing here:
  pytest-django gives each worker its own test database.
- `--dist loadfile`: a test file goes to one worker, except that every
  test of the real Kubernetes cluster goes to one worker, and every test of
  the real Slurm to one, so each is started once in the run rather than on
  every worker (tests/support/kube_cluster.py, tests/support/
  slurm_cluster.py). Scopes are handed out largest first, so the real
  clusters' tests start early beside the rest.
"""

import json
import os
import re
import tempfile
from pathlib import Path

import pytest

_worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... on a worker
if _worker:
    _base = os.environ.get("REGATTA_STATE_DIR") or str(
        Path(__file__).resolve().parents[2] / ".regatta" / "test")
    os.environ["REGATTA_STATE_DIR"] = str(Path(_base) / _worker)
    _url = os.environ.get("REDIS_URL", "")
    _db = re.fullmatch(r"(redis://[^/]+/)(\d+)", _url)
    if _db:
        _index = int(_worker.removeprefix("gw"))
        os.environ["REDIS_URL"] = f"{_db.group(1)}{(int(_db.group(2)) + _index) % 16}"
    else:
        os.environ.pop("REDIS_URL", None)


# The real clusters' tests, by the fixture that starts each cluster.
_CLUSTERS = (("kube", "real-kubernetes"), ("slurm", "real-slurm"))
# Where gw0 writes, for the controller's scheduler, which test files need a
# real cluster: only a worker collects, and only the controller schedules.
_GROUPS_ENV = "REGATTA_XDIST_GROUPS"


def _cluster(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    return next((group for fixture, group in _CLUSTERS if fixture in names), None)


def pytest_configure(config):
    if not _worker and config.getvalue("dist") == "loadfile" and config.getvalue("numprocesses"):
        folder = Path(tempfile.mkdtemp(prefix="regatta-xdist-"))
        os.environ[_GROUPS_ENV] = str(folder / "groups.json")  # the workers inherit it


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    target = os.environ.get(_GROUPS_ENV)
    if _worker != "gw0" or not target:
        return
    groups = {}
    for item in items:
        group = _cluster(item)
        if group:
            groups[item.nodeid.split("::", 1)[0]] = group
    tmp = Path(f"{target}.tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(target)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that the files of each real cluster's tests
    go to one worker together, so each cluster is started once in the run.
    (pytest-xdist's `loadgroup` would say this with marks, but it renames
    test ids through an attribute pytest 9 no longer reads.)"""
    target = os.environ.get(_GROUPS_ENV)
    if not target:
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileAndCluster(LoadFileScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # written before gw0 reported its collection
                self.groups = json.loads(Path(target).read_text())
            path = super()._split_scope(nodeid)
            return self.groups.get(path, path)

    return ByFileAndCluster(config, log)
