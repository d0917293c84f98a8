"""The node book: the local fleet's logical nodes and pending health signals,
one JSON file per cluster shared by the web, worker and beat processes.

Every change happens under an exclusive `fcntl` lock and is written
atomically (regatta/node/files.py), so a reader never sees half a book and
two writers never lose each other's change.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

from regatta.node.files import file_lock, read_json, write_json


class NodeBook:
    """`{"pools": {pool: {"next": n, "nodes": {name: {...}}}}, "signals": [...]}`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / "nodes.json"
        self.lock_path = self.root / "nodes.lock"

    @contextmanager
    def edit(self):
        """The whole book, locked; whatever the caller changes is saved."""
        with file_lock(self.lock_path):
            data = read_json(self.path, None) or {"pools": {}, "signals": []}
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                write_json(self.path, data)

    def read(self) -> dict:
        return read_json(self.path, None) or {"pools": {}, "signals": []}

    @staticmethod
    def pool(data: dict, pool: str) -> dict:
        return data["pools"].setdefault(pool, {"next": 0, "nodes": {}})

    @staticmethod
    def new_node(data: dict, cluster: str, pool: str, name: str = "") -> dict:
        entry = NodeBook.pool(data, pool)
        if not name:
            name = f"{cluster}-{pool}-{entry['next']}"
            while name in entry["nodes"]:
                entry["next"] += 1
                name = f"{cluster}-{pool}-{entry['next']}"
            entry["next"] += 1
        node = {
            "name": name, "provider_id": f"local://{cluster}/{name}", "created_at": time.time(),
            "retired": False, "retired_at": None, "unschedulable": False, "bad": False,
            "hung": False, "down": False,
        }
        entry["nodes"][name] = node
        return node
