"""Metric ingestion: a batch of points stored in one statement, idempotently.

The hot path of the control plane (every rank of every job, every few
seconds), so no ORM objects are built: the points are checked by plain type
tests and written with a raw cursor under `INSERT ... ON CONFLICT DO NOTHING
RETURNING`. The unique key (attempt, rank, name, step) makes a retried
batch, or two copies racing, store each point once; the RETURNING rows are
exactly the points that were new, so the reply's counts and the rollups
added from them (jobs/rollups.py) are exact too.

PostgreSQL: one statement (`_PG_STORE`), the points as five arrays bound in
binary through `unnest`, so its text is the same for every batch size; a
VALUES list bound by Django's client-side cursor spent a third of a
500-point batch quoting parameters in Python. COPY was not tried: it cannot
skip conflicts, so it would need a temporary table and a second INSERT ...
SELECT, for batches of at most 5,000 points. SQLite (3.35+: ON CONFLICT,
RETURNING): a VALUES list and the same writes as three statements of one
transaction.

Batches that arrive together in one process are written together
(`_Coalescer`): a statement and its commit cost PostgreSQL about as much
CPU as a few hundred points, so a batch of 10 was mostly that fixed cost.
Each batch's request still waits for the commit that holds its points
before it is answered, so an acknowledged point is a stored point.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from . import rollups

MAX_BATCH = 5000
# The last second a datetime can hold (9999-12-31T23:59:59Z).
MAX_TIME = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
POINT_FIELDS = frozenset(("rank", "name", "step", "value", "time"))
MAX_RANK = 65535
MAX_STEP = 2**31 - 1
MAX_NAME = 64
# SQLite takes at most 32766 parameters a statement (7 a point).
_POINTS_PER_STATEMENT = 2000
_INSERT = ("INSERT INTO jobs_metricpoint (job_id, attempt_id, rank, name, step, value, time) "
           "VALUES {values} ON CONFLICT (attempt_id, rank, name, step) DO NOTHING "
           "RETURNING rank, name, step, value")
_PG_STORE = (
    "WITH u AS ("
    " SELECT * FROM unnest(%(batches)b::int[], %(jobs)b::int8[], %(attempts)b::int8[],"
    " %(ranks)b::int[], %(names)b::text[], %(steps)b::int[], %(values)b::float8[],"
    " %(times)b::float8[]) AS u(b, j, a, r, n, s, v, t)"
    "), new AS ("
    " INSERT INTO jobs_metricpoint (job_id, attempt_id, rank, name, step, value, time)"
    " SELECT j, a, r, n, s, v, COALESCE(to_timestamp(t), now()) FROM u"
    " ON CONFLICT (attempt_id, rank, name, step) DO NOTHING"
    " RETURNING job_id, attempt_id, rank, name, step, value"
    # The new points are aggregated once, into the finest level's buckets,
    # and every level is built from those: each coarser bucket is a union
    # of whole finest buckets (LEVELS are multiples of the first), and its
    # last value is that of the finest bucket with the greatest last step.
    # Aggregating every point once a level sorted six times the rows.
    "), fine AS ("
    f" SELECT attempt_id, name, rank = 0 AS rank0, step / {rollups.LEVELS[0]} AS bucket,"
    " min(step) AS s0, max(step) AS s1, min(value) AS vmin, max(value) AS vmax,"
    " sum(value) AS vsum, count(*) AS n, (array_agg(value ORDER BY step DESC, rank))[1] AS vlast"
    " FROM new GROUP BY 1, 2, 3, 4"
    "), roll AS ("
    f" INSERT INTO {rollups.TABLE} ({','.join(rollups.COLUMNS)})"
    f" SELECT attempt_id, name, rank0, l.level, bucket / (l.level / {rollups.LEVELS[0]}),"
    " min(s0), max(s1), min(vmin), max(vmax), sum(vsum), sum(n),"
    " (array_agg(vlast ORDER BY s1 DESC))[1]"
    " FROM fine CROSS JOIN unnest(%(levels)s::int[]) AS l(level)"
    " GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5 "
    f"{rollups.ON_CONFLICT}"
    "), named AS ("
    " INSERT INTO jobs_metricname (job_id, name) SELECT DISTINCT job_id, name FROM new"
    " ORDER BY 1, 2 ON CONFLICT (job_id, name) DO NOTHING"
    # Each new point is counted to the batch whose copy of it was written
    # (the arrays hold a key once, see _arrays).
    ") SELECT u.b, count(*) FROM new JOIN u"
    " ON (u.a, u.r, u.n, u.s) = (new.attempt_id, new.rank, new.name, new.step) GROUP BY u.b"
)
# DO NOTHING takes no lock on a name already there, so the ranks of one job
# never queue on its names. Run on every batch with new points: a cache of
# the names known to be stored would go stale where ids are reused (SQLite
# hands a deleted job's id to the next one).
_NAMES = ("INSERT INTO jobs_metricname (job_id, name) VALUES {values} "
          "ON CONFLICT (job_id, name) DO NOTHING")


class AttemptGone(Exception):
    """The attempt's row no longer exists (its job was deleted)."""


@dataclass
class Stored:
    new: int
    duplicates: int


def _number(value) -> bool:
    # An int past a double's range would overflow isfinite: not a finite number either.
    try:
        return type(value) in (int, float) and math.isfinite(value)
    except OverflowError:
        return False


def point_ok(point) -> bool:
    """Whether a point is well formed, by plain type tests (the slow path in
    jobs/views/worker_metrics.py names what is wrong with one that is not)."""
    if type(point) is not dict or not point.keys() <= POINT_FIELDS:
        return False
    rank, name, step = point.get("rank"), point.get("name"), point.get("step")
    when = point.get("time")
    return (
        type(rank) is int and 0 <= rank <= MAX_RANK
        and type(name) is str and 0 < len(name) <= MAX_NAME
        and type(step) is int and 0 <= step <= MAX_STEP
        and _number(point.get("value"))
        and (when is None or (_number(when) and 0 <= when <= MAX_TIME))
    )


def rows(points: list) -> list[tuple[int, str, int, float, float | None]]:
    """Checked points as (rank, name, step, value, time); the first of a
    point repeated in the batch wins."""
    seen: dict[tuple, tuple] = {}
    for p in points:
        rank, name, step = p["rank"], p["name"], p["step"]
        when = p.get("time")
        seen.setdefault((rank, name, step), (rank, name, step, float(p["value"]),
                                             None if when is None else float(when)))
    return list(seen.values())


def store(job_id: int, attempt_id: int, points: list[tuple], received: int) -> Stored:
    """Store the new points of a batch and add them to the rollups, in one
    transaction. `received` counts the batch's points before in-batch
    repeats were dropped. Raises AttemptGone if the attempt's row is gone."""
    try:
        if connection.vendor != "postgresql":
            new = len(_store_portable(job_id, attempt_id, sorted(points, key=_key)))
        elif connection.in_atomic_block or not connection.get_autocommit():
            # The caller's transaction must hold the points: written here, alone.
            new = _store_postgres([_Batch(job_id, attempt_id, points)])[0]
        else:
            new = _coalescer.store(_Batch(job_id, attempt_id, points))
    except IntegrityError as exc:
        # Only foreign keys can fail here: conflicts on the unique key are skipped.
        raise AttemptGone(attempt_id) from exc
    return Stored(new=new, duplicates=received - new)


@dataclass(eq=False)
class _Batch:
    job_id: int
    attempt_id: int
    rows: list[tuple]
    new: int | None = None  # set once a commit holds the batch
    failed: bool = False  # its group's statement failed: it is written alone
    done: bool = field(default=False, repr=False)


class _Coalescer:
    """Writes the batches that one process's threads are waiting on together.

    No timer and no added wait: the first thread to arrive writes its batch
    at once, and those that arrive while that statement runs queue; the
    next of them to wake writes every batch then queued (up to MAX_BATCH
    points) in one statement and one commit, and answers the rest. A busy
    server so writes fewer, larger statements, an idle one the same as
    before. Should the group's statement fail (a deleted attempt, a string
    PostgreSQL refuses, a lost connection), every batch of it is written
    alone on its own thread's connection, so each gets its own error.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[_Batch] = []
        self._busy = False

    def store(self, batch: _Batch) -> int:
        with self._cond:
            self._queue.append(batch)
            while self._busy and not batch.done:
                self._cond.wait()
            if batch.done:
                return self._outcome(batch)
            self._busy = True
            group = self._take(batch)
        news: list = [None] * len(group)
        try:
            news = _store_postgres(group)
        except Exception:  # noqa: BLE001
            # Nothing of the group was written: each batch is written alone
            # below, and gets its own error.
            pass
        finally:
            with self._cond:
                for one, new in zip(group, news, strict=True):
                    one.new, one.failed, one.done = new, new is None, True
                self._busy = False
                self._cond.notify_all()
        return self._outcome(batch)

    def _take(self, batch: _Batch) -> list[_Batch]:
        """The caller's batch and those queued behind it, up to MAX_BATCH points."""
        group, size = [batch], len(batch.rows)
        for other in self._queue:
            if other is not batch and size + len(other.rows) <= MAX_BATCH:
                group.append(other)
                size += len(other.rows)
        taken = set(map(id, group))
        self._queue = [b for b in self._queue if id(b) not in taken]
        return group

    @staticmethod
    def _outcome(batch: _Batch) -> int:
        if batch.failed:
            return _store_postgres([_Batch(batch.job_id, batch.attempt_id, batch.rows)])[0]
        return batch.new


_coalescer = _Coalescer()


def _arrays(group: list[_Batch]) -> dict:
    """The group's points as the statement's eight arrays. A point (attempt,
    rank, name, step) that two batches of the group carry (a retry racing
    its original) is written from the first batch and counted a duplicate
    of the second, as if they had come one after the other; the rows are in
    key order, the one lock order of every statement (no deadlocks)."""
    claimed: dict[tuple, tuple] = {}
    for index, batch in enumerate(group):
        for rank, name, step, value, when in batch.rows:
            claimed.setdefault((batch.attempt_id, rank, name, step),
                               (index, batch.job_id, value, when))
    keys = sorted(claimed)
    columns = {"batches": [], "jobs": [], "attempts": [], "ranks": [], "names": [],
               "steps": [], "values": [], "times": []}
    for key in keys:
        index, job_id, value, when = claimed[key]
        columns["batches"].append(index)
        columns["jobs"].append(job_id)
        columns["attempts"].append(key[0])
        columns["ranks"].append(key[1])
        columns["names"].append(key[2])
        columns["steps"].append(key[3])
        columns["values"].append(value)
        columns["times"].append(when)
    return columns


def _store_postgres(group: list[_Batch]) -> list[int]:
    """One statement, so one round trip and one commit for the whole group:
    the points go in as arrays (the statement's text is the same for every
    size), and the rollups and names are written by data-modifying CTEs from
    exactly the rows the INSERT returned. The new points of each batch."""
    connection.ensure_connection()
    # Server-side binding, the arrays in binary (%b): Django's own cursor
    # binds on the client, quoting every element in Python (a third of a
    # 500-point batch's time). Wrapped as Django wraps its cursors, so errors
    # are Django's and the statement is seen by query logging and counting.
    with connection._prepare_cursor(psycopg.Cursor(connection.connection)) as cursor:
        cursor.execute(_PG_STORE, {**_arrays(group), "levels": list(rollups.LEVELS)})
        new = dict(cursor.fetchall())
    return [new.get(index, 0) for index in range(len(group))]


def _store_portable(job_id: int, attempt_id: int, points: list[tuple]) -> list[tuple]:
    """SQLite: the same writes as statements of one transaction, the rollups
    aggregated here from the rows the INSERT returned."""
    stamp = connection.ops.adapt_datetimefield_value
    now = stamp(timezone.now())
    params = []
    for rank, name, step, value, when in points:
        params += (job_id, attempt_id, rank, name, step, value,
                   now if when is None else stamp(datetime.fromtimestamp(when, UTC)))
    with transaction.atomic(), connection.cursor() as cursor:
        new = _insert(cursor, params)
        rollups.add(cursor, rollups.aggregate(attempt_id, new))
        if new:
            _add_names(cursor, job_id, sorted({row[1] for row in new}))
    return new


def _key(row):
    return row[:3]


def _insert(cursor, params: list) -> list[tuple]:
    new = []
    width = 7 * _POINTS_PER_STATEMENT
    for lo in range(0, len(params), width):
        chunk = params[lo:lo + width]
        values = ",".join(["(%s,%s,%s,%s,%s,%s,%s)"] * (len(chunk) // 7))
        cursor.execute(_INSERT.format(values=values), chunk)
        new += cursor.fetchall()
    return new


def _add_names(cursor, job_id: int, names: list[str]) -> None:
    values = ",".join(["(%s,%s)"] * len(names))
    cursor.execute(_NAMES.format(values=values), [v for name in names for v in (job_id, name)])
