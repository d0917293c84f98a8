"""Each pytest-xdist worker (`make test-fast` runs two) gets a state folder
and a Redis of its own, so two workers never share a SQLite file, a broker
database or a local fleet folder.

Loaded as a plugin (`-p`, see pyproject.toml) because it must set the
environment before pytest-django reads the settings, which happens before
any conftest is imported. Without xdist it does nothing.

The state folder is the run's folder plus the worker's name. A REDIS_URL
given to the run names one database, which the suite empties at its start
(tests/conftest.py), so two workers cannot share it: each worker drops it
and starts the embedded Redis in its own folder instead. PostgreSQL needs
nothing here: pytest-django gives each worker its own test database.
"""

import os
from pathlib import Path

_worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... on a worker
if _worker:
    _base = os.environ.get("REGATTA_STATE_DIR") or str(
        Path(__file__).resolve().parents[2] / ".regatta" / "test")
    os.environ["REGATTA_STATE_DIR"] = str(Path(_base) / _worker)
    os.environ.pop("REDIS_URL", None)
