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
- `--dist loadfile`: a test file goes to one worker, except that the real
  clusters' tests go to one worker together (tests/support/kube_cluster.py,
  tests/support/slurm_cluster.py): each cluster is started once in the run,
  and never beside the other (the two side by side, one per worker, left
  the machine 38 to 51 % idle for two minutes of every run).
- Scopes are handed out costliest first, by an estimate from their marks
  (SLOW_S for a test marked slow, FAST_S for any other: the means of a full
  run), so the files of long end-to-end tests start early and the run ends
  on short ones. Handed out by count (xdist's order), single-test files of a
  minute or two came last, and one worker ran them while the other sat idle.
  Where the Kubernetes cluster's binaries are still building (a cold
  machine), its tests are a scope of their own, handed out last, so that no
  worker waits on the build while other files are left.
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


# The real clusters' tests, by the fixture that starts each cluster: one
# scope for both.
_CLUSTERS = ("kube", "slurm")
_CLUSTER_SCOPE = "real-clusters"
_KUBE_WHILE_BUILDING = "real-kubernetes-after-its-build"
# Estimated seconds per test, from a full run's durations (2,636 tests):
# those marked slow averaged 10 s, the rest 0.25 s.
SLOW_S = 10.0
FAST_S = 0.25
# Where gw0 writes, for the controller's scheduler, which test files need a
# real cluster and what each scope is estimated to cost: only a worker
# collects, and only the controller schedules.
_GROUPS_ENV = "REGATTA_XDIST_GROUPS"


def _cluster(item) -> str | None:
    names = getattr(item, "fixturenames", ())
    return next((fixture for fixture in _CLUSTERS if fixture in names), None)


def _kube_building() -> bool:
    from testcluster import build

    folder = build.bin_dir()
    return not build.binaries_present(folder) and build.building_now(folder)


def pytest_configure(config):
    if not _worker and config.getvalue("dist") == "loadfile" and config.getvalue("numprocesses"):
        folder = Path(tempfile.mkdtemp(prefix="regatta-xdist-"))
        os.environ[_GROUPS_ENV] = str(folder / "groups.json")  # the workers inherit it


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    target = os.environ.get(_GROUPS_ENV)
    if _worker != "gw0" or not target:
        return
    building = _kube_building()
    scopes = {}
    for item in items:
        cluster = _cluster(item)
        if cluster:
            scopes[item.nodeid.split("::", 1)[0]] = (
                _KUBE_WHILE_BUILDING if cluster == "kube" and building else _CLUSTER_SCOPE)
    costs = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        scope = scopes.get(path, path)
        costs[scope] = costs.get(scope, 0.0) + (
            SLOW_S if item.get_closest_marker("slow") else FAST_S)
    if _KUBE_WHILE_BUILDING in costs:
        costs[_KUBE_WHILE_BUILDING] = -1.0
    tmp = Path(f"{target}.tmp")
    tmp.write_text(json.dumps({"scopes": scopes, "costs": costs}))
    tmp.replace(target)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that the real clusters' files go to one
    worker together, and scopes go out costliest first. (pytest-xdist's
    `loadgroup` would say the first with marks, but it renames test ids
    through an attribute pytest 9 no longer reads.)"""
    target = os.environ.get(_GROUPS_ENV)
    if not target:
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFileAndCluster(LoadFileScheduling):
        plan: dict | None = None

        def _read_plan(self) -> dict:
            if self.plan is None:  # written before gw0 reported its collection
                self.plan = json.loads(Path(target).read_text())
            return self.plan

        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return self._read_plan()["scopes"].get(path, path)

        def _assign_work_unit(self, node) -> None:
            costs = self._read_plan()["costs"]
            costliest = max(self.workqueue, key=lambda scope: costs.get(scope, 0.0))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

    return ByFileAndCluster(config, log)
