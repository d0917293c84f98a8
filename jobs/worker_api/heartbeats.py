"""A rank's heartbeat, written in as few statements as it can be.

Every rank beats every few seconds (2,000 ranks are 400 beats a second), so
the beat reads nothing it does not also write: the attempt's row is updated
only while the attempt has not ended, and that same UPDATE returns what the
reply needs (the directives, whether a first step was seen). No row back
means the attempt has ended (or is gone): the rank is told to stop, and
nothing is written. Then the rank's status row is upserted; rank 0 also
moves the job's progress; the node's last heartbeat is written at most every
NODE_HEARTBEAT_EVERY.

On PostgreSQL all of that is one statement (`_PG_BEAT`: the attempt's
UPDATE, and data-modifying CTEs that write only if it returned a row), so
one round trip and one commit, with no ORM query built: the beat cost
twice a metric batch as five statements in a transaction. SQLite, which has
no data-modifying CTEs, runs them one by one (`_record_portable`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Q
from regatta import contract

from clusters.models import Node
from controlplane.lib.prepared import prepared_cursor
from controlplane.lib.tasks import RECONCILE_JOB
from jobs.models import JobAttempt, RankStatus, TrainingJob, directives

PROGRESS_KEYS = contract.PROGRESS
# A node's "last heartbeat" is written at most this often: its ranks all
# beat every few seconds, and the node page reads it in seconds too.
NODE_HEARTBEAT_EVERY = timedelta(seconds=5)

_ENDED = tuple(str(state) for state in JobAttempt.ENDED)
_BEAT = (
    "UPDATE jobs_jobattempt SET last_heartbeat_at = %s, "
    "last_step = CASE WHEN last_step < %s THEN %s ELSE last_step END "
    "WHERE id = %s AND state NOT IN (%s, %s, %s) "
    "RETURNING first_step_at, checkpoint_request_id, stop_requested_at, "
    "profile_request_id, profile_steps, "
    "(SELECT checkpoint_policy FROM jobs_trainingjob j WHERE j.id = jobs_jobattempt.job_id), "
    "(SELECT checkpoint_interval_steps FROM jobs_trainingjob j "
    "WHERE j.id = jobs_jobattempt.job_id)"
)
_RANK = (
    "INSERT INTO jobs_rankstatus (attempt_id, rank, node_name, step, gpu, last_heartbeat_at, "
    "samples_per_s, tokens_per_s, step_time_s) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (attempt_id, rank) DO UPDATE SET node_name = excluded.node_name, "
    "step = excluded.step, gpu = excluded.gpu, last_heartbeat_at = excluded.last_heartbeat_at, "
    "samples_per_s = excluded.samples_per_s, tokens_per_s = excluded.tokens_per_s, "
    "step_time_s = excluded.step_time_s"
)


# The statements run in the order written (the attempt first: the main
# query reads it; then the CTEs nothing reads, in order), which is the
# portable path's lock order: attempt, rank, node, job.
_PG_BEAT = (
    # Every parameter cast: the statement is prepared and bound on the
    # server (controlplane/lib/prepared.py), where a None has no type.
    "WITH a AS ("
    " UPDATE jobs_jobattempt SET last_heartbeat_at = %(now)s::timestamptz,"
    " last_step = CASE WHEN last_step < %(step)s::int THEN %(step)s::int ELSE last_step END,"
    " first_step_at = CASE WHEN first_step_at IS NULL AND %(step)s::int >= 1"
    " THEN %(now)s::timestamptz ELSE first_step_at END"
    " WHERE id = %(attempt)s::int8 AND state <> ALL(%(ended)s::text[])"
    # first_step_at equal to this beat's time: this beat saw the first step.
    " RETURNING first_step_at = %(now)s::timestamptz AND %(step)s::int >= 1,"
    " checkpoint_request_id, stop_requested_at, profile_request_id, profile_steps,"
    " (SELECT checkpoint_policy FROM jobs_trainingjob j WHERE j.id = jobs_jobattempt.job_id),"
    " (SELECT checkpoint_interval_steps FROM jobs_trainingjob j"
    " WHERE j.id = jobs_jobattempt.job_id)"
    "), r AS ("
    " INSERT INTO jobs_rankstatus (attempt_id, rank, node_name, step, gpu, last_heartbeat_at,"
    " samples_per_s, tokens_per_s, step_time_s)"
    " SELECT %(attempt)s::int8, %(rank)s::int, %(node)s::text, %(step)s::int, %(gpu)s::jsonb,"
    " %(now)s::timestamptz, %(samples_per_s)s::float8, %(tokens_per_s)s::float8,"
    " %(step_time_s)s::float8 FROM a"
    " ON CONFLICT (attempt_id, rank) DO UPDATE SET node_name = excluded.node_name,"
    " step = excluded.step, gpu = excluded.gpu, last_heartbeat_at = excluded.last_heartbeat_at,"
    " samples_per_s = excluded.samples_per_s, tokens_per_s = excluded.tokens_per_s,"
    " step_time_s = excluded.step_time_s"
    "), n AS ("
    " UPDATE clusters_node SET last_heartbeat_at = %(now)s::timestamptz"
    " WHERE %(node)s::text <> '' AND name = %(node)s::text AND EXISTS (SELECT 1 FROM a)"
    " AND id IN (SELECT node_id FROM jobs_attemptnode WHERE attempt_id = %(attempt)s::int8)"
    " AND (last_heartbeat_at IS NULL OR last_heartbeat_at < %(stale)s::timestamptz)"
    "), j AS ("
    " UPDATE jobs_trainingjob SET current_step = %(step)s::int,"
    " progress = %(progress)s::jsonb"
    " WHERE %(rank)s::int = 0 AND id = %(job)s::int8 AND current_step <= %(step)s::int"
    " AND EXISTS (SELECT 1 FROM a)"
    ") SELECT * FROM a"
)


@dataclass
class Beat:
    job_id: int
    attempt_id: int
    rank: int
    node: str
    step: int
    rates: dict
    gpu: dict | None


def record(beat: Beat, now) -> dict | None:
    """Write one heartbeat; the reply's directives, or None if the attempt
    has ended (nothing written then)."""
    if connection.vendor == "postgresql":
        return _record_postgres(beat, now)
    return _record_portable(beat, now)


def _progress(beat: Beat, now) -> dict:
    return {"step": beat.step, "attempt": beat.attempt_id, "at": now.isoformat(), **beat.rates}


def _record_postgres(beat: Beat, now) -> dict | None:
    gpu = RankStatus._meta.get_field("gpu").get_db_prep_value(beat.gpu, connection)
    with prepared_cursor(connection) as cursor:
        cursor.execute(_PG_BEAT, {
            "now": now, "step": beat.step, "attempt": beat.attempt_id, "ended": list(_ENDED),
            "rank": beat.rank, "node": beat.node, "gpu": gpu, "job": beat.job_id,
            **{key: beat.rates.get(key) for key in PROGRESS_KEYS},
            "stale": now - NODE_HEARTBEAT_EVERY,
            "progress": json.dumps(_progress(beat, now)),
        })
        row = cursor.fetchone()
    if row is None:
        return None
    first_step, request_id, stop_at, profile_id, profile_steps, policy, interval = row
    if first_step:
        # The fast path: the reconciler marks the job running now, not at its next sweep.
        RECONCILE_JOB.soon(beat.job_id)
    return directives(request_id, stop_at, policy, interval, profile_id, profile_steps)


def _record_portable(beat: Beat, now) -> dict | None:
    stamp = connection.ops.adapt_datetimefield_value(now)
    gpu = RankStatus._meta.get_field("gpu").get_db_prep_value(beat.gpu, connection)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_BEAT, [stamp, beat.step, beat.step, beat.attempt_id, *_ENDED])
        row = cursor.fetchone()
        if row is None:
            return None
        first_step_at, request_id, stop_at, profile_id, profile_steps, policy, interval = row
        rates = [beat.rates.get(key) for key in PROGRESS_KEYS]
        cursor.execute(_RANK, [beat.attempt_id, beat.rank, beat.node, beat.step, gpu, stamp,
                               *rates])
        _node_heard(beat, now)
        if beat.step >= 1 and first_step_at is None and JobAttempt.objects.filter(
            pk=beat.attempt_id, first_step_at__isnull=True
        ).update(first_step_at=now):
            # The fast path: the reconciler marks the job running now, not at its next sweep.
            RECONCILE_JOB.soon(beat.job_id)
        if beat.rank == 0:
            TrainingJob.objects.filter(pk=beat.job_id, current_step__lte=beat.step).update(
                current_step=beat.step, progress=_progress(beat, now))
    return directives(request_id, stop_at, policy, interval, profile_id, profile_steps)


def _node_heard(beat: Beat, now) -> None:
    """The node a rank runs on was heard from (Node.last_heartbeat_at, on
    the node page and the API): only a node placed in this attempt, so a
    worker cannot vouch for nodes it does not run on. The condition on the
    row makes it a write only once a period, whichever of the node's ranks
    and server processes gets there first.
    """
    if not beat.node:
        return
    Node.objects.filter(placements__attempt_id=beat.attempt_id, name=beat.node).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=now - NODE_HEARTBEAT_EVERY)
    ).update(last_heartbeat_at=now)
