"""Metric ingestion: a batch of points stored in one statement, idempotently.

The hot path of the control plane (every rank of every job, every few
seconds), so no ORM objects are built: the points are written with a raw
cursor under `INSERT ... ON CONFLICT DO NOTHING RETURNING`. The primary key
(job, name, rank, step, attempt) makes a retried batch, or two copies
racing, store each point once; the RETURNING rows are exactly the points
that were new, so the reply's counts and the rollups added from them
(jobs/metrics/rollups.py) are exact too.

PostgreSQL: one prepared statement (`_PG_STORE`), the points as columns
through `unnest`, each column one array literal built in C (`_params`), so
its text is the same for every batch size. Repeated points are dropped and
the rows put in key order there too. COPY was not tried: it cannot skip
conflicts, so it would need a temporary table and a second INSERT ...
SELECT, for batches of at most 5,000 points. SQLite (3.35+: ON CONFLICT,
RETURNING): a VALUES list and the same writes as statements of one
transaction.

What a 500-point batch cost PostgreSQL and the web process, and what took
it down (docs/performance.md, "Ingestion at ten times MLflow"): a foreign
key checked point by point, a surrogate id and a second index, psycopg
dumping arrays element by element, planning the statement every time.

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

import msgspec
from django.db import connection, transaction
from django.utils import timezone
from regatta import contract

from controlplane.lib.prepared import prepared_cursor
from jobs.metrics import rollups

# A point's bounds, from the worker contract's table (regatta/contract.py),
# bound here once: point_ok runs for every point.
MAX_BATCH = contract.METRIC_BATCH["points"].max_length
POINT_FIELDS = contract.METRIC_POINT.names
MAX_RANK = contract.METRIC_POINT["rank"].maximum
MAX_NAME = contract.METRIC_POINT["name"].max_length
MAX_STEP = contract.METRIC_POINT["step"].maximum
MAX_TIME = contract.METRIC_POINT["time"].maximum
# SQLite takes at most 32766 parameters a statement (7 a point).
_POINTS_PER_STATEMENT = 2000
# The points' primary key (jobs.metrics.models.MetricPoint).
_KEY = "job_id, name, rank, step, attempt_id"
_INSERT = ("INSERT INTO jobs_metricpoint (job_id, attempt_id, rank, name, step, value, time) "
           f"VALUES {{values}} ON CONFLICT ({_KEY}) DO NOTHING "
           "RETURNING rank, name, step, value")
_PG_STORE = (
    # The points as columns, each one text array literal (see _params): the
    # batch (1-based, within the group) and the index of the name in %(names)s.
    "WITH p AS ("
    " SELECT * FROM unnest(%(batch)s::int[], %(rank)s::int[], %(name)s::int[], %(step)s::int[],"
    " %(value)s::float8[], %(time)s::float8[]) WITH ORDINALITY AS p(b, r, ni, s, v, t, o)"
    # The attempts exist, and stay until this commits: a deletion locks them
    # first (jobs/receivers.py), so it waits for these points and then
    # deletes them. One lock per attempt instead of a foreign key checked
    # point by point (a quarter of a 500-point batch's time).
    "), ok AS ("
    " SELECT id FROM jobs_jobattempt WHERE id = ANY(%(attempts)s::int8[]) FOR KEY SHARE"
    # A point carried twice is written from its first copy: the earlier
    # batch of the group, then the earlier in the batch, as if the copies had
    # come one after the other. Key order is the one lock order of every
    # statement (no deadlocks): the INSERT reads the materialized rows in
    # the order they were sorted in. Points of a gone attempt are left out.
    "), u AS MATERIALIZED ("
    " SELECT DISTINCT ON (j, n, r, s, a) b, (%(jobs)s::int8[])[b] AS j,"
    " (%(attempts)s::int8[])[b] AS a, r, (%(names)s::text[])[ni] AS n, s, v, t"
    " FROM p WHERE (%(attempts)s::int8[])[b] IN (SELECT id FROM ok)"
    " ORDER BY j, n, r, s, a, b, o"
    "), new AS ("
    " INSERT INTO jobs_metricpoint (job_id, attempt_id, rank, name, step, value, time)"
    " SELECT j, a, r, n, s, v, COALESCE(to_timestamp(t), now()) FROM u"
    f" ON CONFLICT ({_KEY}) DO NOTHING"
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
    f" FROM fine CROSS JOIN unnest('{{{','.join(map(str, rollups.LEVELS))}}}'::int[]) AS l(level)"
    " GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5 "
    f"{rollups.ON_CONFLICT}"
    # Each batch's names, once each (its batch and name index pairs), rather
    # than every new point sorted for them; a name whose points were all
    # stored before is there already.
    "), named AS ("
    " INSERT INTO jobs_metricname (job_id, name)"
    " SELECT DISTINCT (%(jobs)s::int8[])[x.b], (%(names)s::text[])[x.ni]"
    " FROM unnest(%(named_batch)s::int[], %(named_name)s::int[]) AS x(b, ni)"
    " WHERE (%(attempts)s::int8[])[x.b] IN (SELECT id FROM ok)"
    " ORDER BY 1, 2 ON CONFLICT (job_id, name) DO NOTHING"
    # Each new point is counted to the batch whose copy of it was written:
    # a key of `u` (one row each) that `new` returned too is there twice.
    # Grouped, not joined: a join of the two is planned from their
    # estimates, and a generic plan with stale statistics (an attempts table
    # analyzed while empty) once made it a nested loop, every new point
    # against every row of `u`: 118 s for 30,000 points, 3 s for a 5,000.
    "), counted AS ("
    " SELECT b, count(*) AS n FROM ("
    " SELECT max(b) AS b FROM ("
    " SELECT a, r, n, s, b FROM u"
    " UNION ALL SELECT attempt_id, rank, name, step, NULL FROM new"
    " ) k GROUP BY a, r, n, s HAVING count(*) = 2"
    " ) x GROUP BY b"
    ") SELECT g.b, g.a IN (SELECT id FROM ok), COALESCE(c.n, 0)"
    " FROM unnest(%(attempts)s::int8[]) WITH ORDINALITY AS g(a, b) LEFT JOIN counted c USING (b)"
    " ORDER BY g.b"
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
    jobs/worker_api/views/metrics.py names what is wrong with one that is not)."""
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
    """Checked points as (rank, name, step, value, time), in batch order
    (a point repeated in the batch is kept: the writer stores its first copy)."""
    return [(p["rank"], p["name"], p["step"], float(p["value"]),
             None if (when := p.get("time")) is None else float(when)) for p in points]


def store(job_id: int, attempt_id: int, points: list[tuple], received: int) -> Stored:
    """Store the new points of a batch, (rank, name, step, value, time) rows
    of which the first copy of a repeated key counts, and add them to the
    rollups, in one transaction. `received` counts the batch's points as
    sent. Raises AttemptGone if the attempt's row is gone."""
    if connection.vendor != "postgresql":
        new = _store_portable(job_id, attempt_id, points)
    elif connection.in_atomic_block or not connection.get_autocommit():
        # The caller's transaction must hold the points: written here, alone.
        new = _store_postgres([_Batch(job_id, attempt_id, points)])[0]
    else:
        new = _coalescer.store(_Batch(job_id, attempt_id, points))
    if new is None:
        raise AttemptGone(attempt_id)
    return Stored(new=new, duplicates=received - new)


@dataclass(eq=False)
class _Batch:
    job_id: int
    attempt_id: int
    rows: list[tuple]
    new: int | None = None  # set once a commit holds the batch; None: the attempt is gone
    failed: bool = False  # its group's statement failed: it is written alone
    done: bool = field(default=False, repr=False)


class _Coalescer:
    """Writes the batches that one process's threads are waiting on together.

    No timer and no added wait: the first thread to arrive writes its batch
    at once, and those that arrive while that statement runs queue; the
    next of them to wake writes every batch then queued (up to MAX_BATCH
    points) in one statement and one commit, and answers the rest. A busy
    server so writes fewer, larger statements, an idle one the same as
    before. Should the group's statement fail (a string PostgreSQL refuses,
    a lost connection), every batch of it is written alone on its own
    thread's connection, so each gets its own error; a deleted attempt
    fails no statement, only its own batch.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[_Batch] = []
        self._busy = False

    def store(self, batch: _Batch) -> int | None:
        with self._cond:
            self._queue.append(batch)
            while self._busy and not batch.done:
                self._cond.wait()
            if batch.done:
                return self._outcome(batch)
            self._busy = True
            group = self._take(batch)
        news: list = [None] * len(group)
        failed = True
        try:
            news = _store_postgres(group)
            failed = False
        except Exception:  # noqa: BLE001
            # Nothing of the group was written: each batch is written alone
            # below, and gets its own error.
            pass
        finally:
            with self._cond:
                for one, new in zip(group, news, strict=True):
                    one.new, one.failed, one.done = new, failed, True
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
    def _outcome(batch: _Batch) -> int | None:
        if batch.failed:
            return _store_postgres([_Batch(batch.job_id, batch.attempt_id, batch.rows)])[0]
        return batch.new


_coalescer = _Coalescer()
_encode = msgspec.json.Encoder().encode


def _array(values) -> str:
    """A PostgreSQL array literal of numbers (None as NULL): their JSON text
    with braces for brackets, built in C. Floats are written shortest
    round-trip, so the server reads back the very same double."""
    return "{" + _encode(values)[1:-1].decode() + "}"


def _quoted(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _params(group: list[_Batch]) -> dict:
    """The group's points as the statement's columns, each one array literal
    (psycopg dumps a list element by element in Python: half of a 500-point
    batch's time in the web process). Names are sent once each, as an index
    into %(names)s: a batch repeats a few names hundreds of times."""
    names: dict[str, int] = {}
    columns: list[list] = [[], [], [], [], [], []]
    batch_column, rank, name, step, value, when = columns
    named_batch, named_name = [], []
    for index, batch in enumerate(group, 1):
        if not batch.rows:
            continue
        ranks, batch_names, steps, values, times = zip(*batch.rows, strict=True)
        batch_column += [index] * len(ranks)
        rank += ranks
        indexes = [names.setdefault(n, len(names) + 1) for n in batch_names]
        name += indexes
        step += steps
        value += values
        when += times
        distinct = set(indexes)
        named_batch += [index] * len(distinct)
        named_name += distinct
    params = {key: _array(column) for key, column in
              zip(("batch", "rank", "name", "step", "value", "time"), columns, strict=True)}
    params["names"] = "{" + ",".join(map(_quoted, names)) + "}"
    params["jobs"] = _array([batch.job_id for batch in group])
    params["attempts"] = _array([batch.attempt_id for batch in group])
    params["named_batch"], params["named_name"] = _array(named_batch), _array(named_name)
    return params


def _store_postgres(group: list[_Batch]) -> list[int | None]:
    """One statement, so one round trip and one commit for the whole group,
    its text the same for every size; the rollups and names are written by
    data-modifying CTEs from exactly the rows the INSERT returned. The new
    points of each batch, None for a batch whose attempt is gone."""
    with prepared_cursor(connection) as cursor:
        cursor.execute(_PG_STORE, _params(group))
        return [new if alive else None for _, alive, new in cursor.fetchall()]


def _store_portable(job_id: int, attempt_id: int, points: list[tuple]) -> int | None:
    """SQLite: the same writes as statements of one transaction (which
    holds the database's write lock from its start), the rollups
    aggregated here from the rows the INSERT returned."""
    first: dict[tuple, tuple] = {}
    for row in points:
        first.setdefault(row[:3], row)
    stamp = connection.ops.adapt_datetimefield_value
    now = stamp(timezone.now())
    params = []
    for rank, name, step, value, when in sorted(first.values(), key=_key):
        params += (job_id, attempt_id, rank, name, step, value,
                   now if when is None else stamp(datetime.fromtimestamp(when, UTC)))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM jobs_jobattempt WHERE id = %s", [attempt_id])
        if cursor.fetchone() is None:
            return None
        new = _insert(cursor, params)
        rollups.add(cursor, rollups.aggregate(attempt_id, new))
        if new:
            _add_names(cursor, job_id, sorted({row[1] for row in new}))
    return len(new)


def _key(row):
    return row[1], row[0], row[2]  # name, rank, step: the key's order


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
