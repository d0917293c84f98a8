"""Reports the control plane has not acknowledged yet: kept in order, in
bounded memory, on local disk past that bound, and handed off at exit.

A reporter's queue (regatta/reporting.py) is a `SpooledQueue`: the newest
items in memory; when the control plane is away and memory passes its
bound, the oldest move to segment files on local disk instead of being
dropped; once the control plane answers again they are read back, one
segment at a time and oldest first, so items still leave in the order they
were made. Only past the disk bound (256 MiB a queue by default) does the
oldest segment go, counted and reported like any drop.

At exit, whatever is still undelivered is handed off: one JSON-lines file
per reporter, written into the job's checkpoint storage at
`reports/attempt-<A>/rank-<R>-<id>.jsonl` (docs/trainer-protocol.md), where
the control plane collects it when the attempt ends. Every item in it can
be stored again without harm (events carry their key, metric points and
checkpoint reports are unique by what they describe), so a report both
delivered late and handed off is stored once.

Standard library only.
"""

from __future__ import annotations

import collections
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = "regatta-reports/1"
MAX_SPOOL_BYTES = 256 << 20


class SpooledQueue:
    """A FIFO of (endpoint, body) items: `replay` (a segment read back) is
    sent first, then the segments on disk, then `memory`. The training
    thread only appends to `memory`; everything else is the reporting
    thread's (or `close`'s, once that thread is stopped or given up on)."""

    def __init__(self, name: str, bound: int, max_bytes: int = MAX_SPOOL_BYTES,
                 folder: Path | None = None):
        self.name, self.bound, self.max_bytes = name, bound, max_bytes
        self.memory: collections.deque = collections.deque()
        self.replay: collections.deque = collections.deque()
        self._folder = folder
        self._segments: collections.deque = collections.deque()  # (path, items, bytes)
        self._seq = 0
        self.spooled = 0
        self.spooled_bytes = 0

    def __len__(self) -> int:
        return len(self.memory) + len(self.replay) + self.spooled

    def over(self) -> bool:
        return len(self.memory) > self.bound

    # -- the reporting thread ----------------------------------------------------
    def spill(self, items: list) -> collections.Counter:
        """Write `items` (the oldest of `memory`, already taken out of it) as
        a segment; returns what the disk bound made it drop, by endpoint."""
        dropped: collections.Counter = collections.Counter()
        try:
            folder = self._ensure_folder()
            path = folder / f"{self.name}-{self._seq:08d}.jsonl"
            data = b"".join(json.dumps(item).encode() + b"\n" for item in items)
            path.write_bytes(data)
        except (OSError, TypeError, ValueError):
            # No disk to spill to: these are lost, and counted.
            dropped.update(endpoint for endpoint, _ in items)
            return dropped
        self._seq += 1
        self._segments.append((path, len(items), len(data)))
        self.spooled += len(items)
        self.spooled_bytes += len(data)
        while self.spooled_bytes > self.max_bytes and len(self._segments) > 1:
            dropped.update(endpoint for endpoint, _ in self._read_oldest())
        return dropped

    def refill(self, at_least: int = 1) -> None:
        """Read the oldest segments back until `at_least` items wait in
        `replay` (file I/O: called without the lock the training thread
        appends under)."""
        while len(self.replay) < at_least and self._segments:
            self.replay.extend(self._read_oldest())

    def head(self) -> tuple[str, dict] | None:
        """The oldest item, without taking it; None while a segment on disk
        is older than `memory` and not read back yet (`refill` first)."""
        if self.replay:
            return self.replay[0]
        if self._segments:
            return None
        return self.memory[0] if self.memory else None

    def pop(self) -> tuple[str, dict]:
        """Take the item `head` returned (replay first, then memory)."""
        return self.replay.popleft() if self.replay else self.memory.popleft()

    def _read_oldest(self) -> list:
        path, count, nbytes = self._segments.popleft()
        self.spooled -= count
        self.spooled_bytes -= nbytes
        try:
            items = [tuple(json.loads(line)) for line in path.read_bytes().splitlines() if line]
            path.unlink()
        except (OSError, ValueError):
            items = []
        return items

    def _ensure_folder(self) -> Path:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="regatta-spool-"))
        self._folder.mkdir(parents=True, exist_ok=True)
        return self._folder

    # -- at exit ----------------------------------------------------------------
    def take_all(self) -> list:
        """Every item, oldest first, the queue left empty."""
        items = list(self.replay)
        self.replay.clear()
        while self._segments:
            items.extend(self._read_oldest())
        items.extend(self.memory)
        self.memory.clear()
        return items

    def remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def handoff_key(attempt_id: str, rank: int, tag: str) -> str:
    """Where a reporter's undelivered items go, relative to the job's
    checkpoint URI (the control plane lists `reports/attempt-<A>/`)."""
    return f"reports/attempt-{attempt_id}/rank-{rank}-{tag}.jsonl"


def handoff_bytes(header: dict[str, Any], items: list) -> bytes:
    """The file: a header line, then one `{"endpoint", "body"}` line per item."""
    lines = [json.dumps({"format": FORMAT, "written": time.time(), **header})]
    lines += [json.dumps({"endpoint": endpoint, "body": body}) for endpoint, body in items]
    return ("\n".join(lines) + "\n").encode()


def storage_handoff(checkpoint_uri: str) -> Callable[[str, bytes], None]:
    """Write a hand-off file into the job's storage (a path or s3://)."""
    def write(key: str, data: bytes) -> None:
        from .storage import open_storage  # boto3 only when there is something to write

        open_storage(checkpoint_uri).write_bytes(key, data)
    return write
