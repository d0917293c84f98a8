"""Per-bucket aggregates of metric points, kept on ingest.

Each new point adds to one bucket per level: `bucket = step // level` for
every level in LEVELS, apart for rank 0 and for the other ranks. A bucket
holds its first and last step, min, max, sum, count and the value at its
last step. A chart of a long series reads the level whose bucket count is
just above what LTTB needs (jobs/metrics/series.py), so its cost follows the chart's
width, never the series' length.

Exactly once: ingest adds to the buckets only the points its INSERT ... ON
CONFLICT DO NOTHING reported as new (RETURNING), in the same transaction,
so a retried or racing copy of a batch adds nothing twice. Every upsert
touches its rows in key order, so two batches of one attempt never deadlock.

The SQL is portable: CASE instead of LEAST/GREATEST, ON CONFLICT and
RETURNING (PostgreSQL, and SQLite since 3.35).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

# Bucket widths in steps, a factor 4 apart: the chosen level holds between
# one and four times the buckets a chart asks for.
LEVELS = (16, 64, 256, 1024, 4096, 16384)
# jobs/metrics/ingest.py builds every level from the first one's buckets.
assert all(level % LEVELS[0] == 0 for level in LEVELS)
TABLE = "jobs_metricrollup"
POINTS_TABLE = "jobs_metricpoint"
COLUMNS = ("attempt_id", "name", "rank0", "level", "bucket", "s0", "s1", "vmin", "vmax",
           "vsum", "n", "vlast")
# SQLite takes at most 32766 parameters a statement.
_ROWS_PER_STATEMENT = 2000


def _merge(into: list, step: int, value: float) -> None:
    """Fold one point into a bucket [s0, s1, vmin, vmax, vsum, n, vlast]."""
    if step < into[0]:
        into[0] = step
    if step > into[1]:  # a tie (two ranks other than 0) keeps the first, the lower rank
        into[1], into[6] = step, value
    if value < into[2]:
        into[2] = value
    if value > into[3]:
        into[3] = value
    into[4] += value
    into[5] += 1


def aggregate(attempt_id: int, points: Iterable[tuple[int, str, int, float]]) -> list[tuple]:
    """The bucket rows of (rank, name, step, value) points, in key order."""
    buckets: dict[tuple, list] = {}
    for rank, name, step, value in points:
        rank0 = rank == 0
        for level in LEVELS:
            key = (name, rank0, level, step // level)
            row = buckets.get(key)
            if row is None:
                buckets[key] = [step, step, value, value, value, 1, value]
            else:
                _merge(row, step, value)
    return [(attempt_id, *key, *row) for key, row in sorted(buckets.items())]


def _on_conflict() -> str:
    """How a bucket row adds to the stored one. Every SET expression reads
    the row as it was, so vlast compares s1 before it moves. The value at
    the last step is rank 0's alone in a rank-0 bucket; in the other ranks'
    bucket, where several ranks reported that step, it is one of theirs
    (the lowest rank's within a batch, the first stored across batches)."""
    t = TABLE

    def least(col):
        return f"CASE WHEN excluded.{col} < {t}.{col} THEN excluded.{col} ELSE {t}.{col} END"

    def greatest(col):
        return f"CASE WHEN excluded.{col} > {t}.{col} THEN excluded.{col} ELSE {t}.{col} END"

    return (
        f"ON CONFLICT (attempt_id, name, rank0, level, bucket) DO UPDATE SET "
        f"s0 = {least('s0')}, s1 = {greatest('s1')}, vmin = {least('vmin')}, "
        f"vmax = {greatest('vmax')}, vsum = {t}.vsum + excluded.vsum, n = {t}.n + excluded.n, "
        f"vlast = CASE WHEN excluded.s1 > {t}.s1 THEN excluded.vlast ELSE {t}.vlast END"
    )


ON_CONFLICT = _on_conflict()


def _upsert_sql(rows: int) -> str:
    values = ",".join(["(" + ",".join(["%s"] * len(COLUMNS)) + ")"] * rows)
    return f"INSERT INTO {TABLE} ({','.join(COLUMNS)}) VALUES {values} {ON_CONFLICT}"


def add(cursor, rows: list[tuple]) -> None:
    """Add aggregated bucket rows (from `aggregate`) to the stored buckets."""
    for lo in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[lo:lo + _ROWS_PER_STATEMENT]
        cursor.execute(_upsert_sql(len(chunk)), [v for row in chunk for v in row])


def rebuild(attempt_ids: Iterable[int] | None = None, using=None) -> int:
    """Build the buckets of existing points from scratch (the data migration
    and `manage.py rebuild_metric_rollups`): the buckets of the given
    attempts (all when None) are deleted and recomputed from the raw points
    in SQL, one INSERT ... SELECT per level. Returns the rows written."""
    conn = using or connection
    where, params = "", []
    if attempt_ids is not None:
        ids = list(attempt_ids)
        if not ids:
            return 0
        listed = ",".join(["%s"] * len(ids))
        where = f"WHERE attempt_id IN ({listed})"
        # The points' key leads with the job: their attempts' jobs first.
        points_where = (f"WHERE job_id IN (SELECT job_id FROM jobs_jobattempt WHERE id IN "
                        f"({listed})) AND {where.removeprefix('WHERE ')}")
        params = ids
    else:
        points_where = ""
    written = 0
    with conn.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} {where}", params)
        for level in LEVELS:
            cursor.execute(_rebuild_sql(level, points_where, conn.vendor),
                           params * 2)
            written += cursor.rowcount
    return written


def _rebuild_sql(level: int, where: str, vendor: str) -> str:
    """One level's buckets from the raw points (the level is one of LEVELS,
    written into the statement: PostgreSQL groups only by an expression it
    can see is the selected one). The value at a bucket's last step is the
    lowest rank's where several ranks other than 0 reported that step, as
    ingest keeps it: PostgreSQL aggregates it in order, in the same pass;
    SQLite, which has no ordered aggregate before 3.44, looks it up on the
    points' key."""
    p, level = POINTS_TABLE, int(level)
    if vendor == "postgresql":
        return (
            f"INSERT INTO {TABLE} ({','.join(COLUMNS)}) "
            f"SELECT attempt_id, name, (rank = 0), {level}, step / {level}, "
            f"MIN(step), MAX(step), MIN(value), MAX(value), SUM(value), COUNT(*), "
            f"(array_agg(value ORDER BY step DESC, rank))[1] FROM {p} {where} "
            f"GROUP BY attempt_id, name, (rank = 0), step / {level}"
        )
    return (
        f"INSERT INTO {TABLE} ({','.join(COLUMNS)}) "
        f"SELECT g.attempt_id, g.name, g.rank0, {level}, g.bucket, g.s0, g.s1, "
        f"g.vmin, g.vmax, g.vsum, g.n, (SELECT q.value FROM {p} q "
        f"WHERE q.job_id = g.job_id AND q.name = g.name AND q.attempt_id = g.attempt_id "
        f"AND (q.rank = 0) = g.rank0 AND q.step = g.s1 "
        f"ORDER BY q.rank LIMIT 1) "
        f"FROM (SELECT job_id, attempt_id, name, (rank = 0) AS rank0, step / {level} AS bucket, "
        f"MIN(step) AS s0, MAX(step) AS s1, MIN(value) AS vmin, MAX(value) AS vmax, "
        f"SUM(value) AS vsum, COUNT(*) AS n FROM {p} {where} "
        f"GROUP BY job_id, attempt_id, name, (rank = 0), step / {level}) g"
    )


def rebuild_names(using=None) -> int:
    """The names table (one row per job and metric) from the raw points."""
    conn = using or connection
    with conn.cursor() as cursor:
        cursor.execute("DELETE FROM jobs_metricname")
        cursor.execute(
            f"INSERT INTO jobs_metricname (job_id, name) "
            f"SELECT DISTINCT job_id, name FROM {POINTS_TABLE}"
        )
        return cursor.rowcount
