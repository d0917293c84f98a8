"""Metric batches that arrive together in one process are written together
(jobs/metrics/ingest.py `_Coalescer`): real PostgreSQL, real threads.

The tests hold the first batch's statement on a table lock taken from a
second connection, so the batches sent meanwhile are certain to queue
behind it; which batches shared a statement is read from the rows' `xmin`
(the transaction that wrote them), not from the code under test.
"""

import threading

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs.metrics import ingest
from jobs.metrics.models import MetricPoint, MetricRollup
from tests.api_factories import make_attempt, make_job
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
                       reason="coalescing is the PostgreSQL path; SQLite writes each batch alone"),
]


def rows(step=0, n=10):
    names = ["loss", "lr"] * (n // 2)
    return [(0, name, step + i // 2, float(i), None) for i, name in enumerate(names)]


@pytest.fixture
def attempts(team, cluster, owner):
    out = []
    for i in range(6):
        job = make_job(team, cluster, owner, name=f"job-{i}", phase="running")
        out.append(make_attempt(job)[0])
    return out


class Held:
    """An EXCLUSIVE lock on the metric names table from a connection of its
    own: a statement that writes names waits until it is released."""

    def __enter__(self):
        self.conn = other_connection()
        self.conn.execute("LOCK TABLE jobs_metricname IN EXCLUSIVE MODE")
        self.watcher = other_connection(autocommit=True)
        return self

    def waited_on(self) -> bool:
        return waiting_on_a_lock(self.watcher)

    def __exit__(self, *exc):
        self.watcher.close()
        self.conn.rollback()
        self.conn.close()


def waiting_on_a_lock(watcher: psycopg.Connection) -> bool:
    """Whether a statement on the test database waits on a lock now. The
    watcher is in autocommit: in a transaction, pg_stat_activity would be
    read once and not again."""
    return watcher.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'").fetchone() is not None


def send_all(batches, results, errors):
    """Each batch from a thread of its own, as a web server's threads would."""
    def send(key, attempt, points):
        try:
            results[key] = ingest.store(attempt.job_id, attempt.pk, points, received=len(points))
        except Exception as exc:  # the test asserts on it
            errors[key] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=batch) for batch in batches]
    for thread in threads:
        thread.start()
    return threads


def wait_queued(count):
    eventually(lambda: len(ingest._coalescer._queue) >= count, timeout=30, interval=0.01,
               what="the batches queued")


def wait_first_held(held):
    """Until the first batch's statement waits on the held lock: batches sent
    from then on queue behind it rather than joining it."""
    eventually(held.waited_on, timeout=30, what="the first batch's statement on the lock")


def writers(attempt) -> set:
    """The transactions that wrote an attempt's points."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT xmin::text FROM jobs_metricpoint WHERE attempt_id = %s",
                       [attempt.pk])
        return {row[0] for row in cursor.fetchall()}


def test_batches_queued_behind_a_statement_share_the_next_one(attempts):
    results, errors = {}, {}
    with Held() as held:
        first = send_all([("first", attempts[0], rows())], results, errors)
        wait_first_held(held)
        rest = send_all([(i, a, rows()) for i, a in enumerate(attempts[1:])], results, errors)
        wait_queued(5)
    for thread in first + rest:
        thread.join(timeout=60)
    assert not errors
    assert {k: (r.new, r.duplicates) for k, r in results.items()} == {
        "first": (10, 0), **{i: (10, 0) for i in range(5)}}
    first_tx = writers(attempts[0])
    later = set().union(*(writers(a) for a in attempts[1:]))
    assert len(first_tx) == 1 and len(later) == 1 and first_tx != later
    # Each attempt's rollups hold its own points only, once.
    for attempt in attempts:
        top = MetricRollup.objects.get(attempt=attempt, name="loss", level=16384)
        assert (top.n, top.vsum) == (5, 0.0 + 2 + 4 + 6 + 8)


def test_a_retry_queued_beside_its_original_is_stored_once(attempts):
    results, errors = {}, {}
    with Held() as held:
        first = send_all([("first", attempts[0], rows(step=100))], results, errors)
        wait_first_held(held)
        rest = send_all([("a", attempts[1], rows()), ("b", attempts[1], rows()),
                         ("c", attempts[2], rows())], results, errors)
        wait_queued(3)
    for thread in first + rest:
        thread.join(timeout=60)
    assert not errors
    copies = sorted((results["a"].new, results["b"].new))
    assert copies == [0, 10]
    assert results["a"].duplicates + results["b"].duplicates == 10
    assert MetricPoint.objects.filter(attempt=attempts[1]).count() == 10
    assert MetricRollup.objects.get(attempt=attempts[1], name="lr", level=16).n == 5
    assert writers(attempts[1]) == writers(attempts[2])


def test_a_batch_whose_attempt_is_gone_is_refused_alone(attempts):
    gone = attempts[3]
    gone_id = gone.pk
    gone.job.delete()  # its batch arrives after its attempt is gone
    results, errors = {}, {}
    with Held() as held:
        first = send_all([("first", attempts[0], rows())], results, errors)
        wait_first_held(held)
        rest = send_all([("ok", attempts[1], rows()), ("gone", gone, rows()),
                         ("also ok", attempts[2], rows())], results, errors)
        wait_queued(3)
    for thread in first + rest:
        thread.join(timeout=60)
    assert set(errors) == {"gone"}
    assert isinstance(errors["gone"], ingest.AttemptGone)
    assert errors["gone"].args == (gone_id,)
    assert (results["ok"].new, results["also ok"].new) == (10, 10)
    assert MetricPoint.objects.filter(attempt_id__in=[attempts[1].pk, attempts[2].pk]).count() == 20
    assert not MetricPoint.objects.filter(attempt_id=gone_id).exists()
    # The gone attempt failed no statement: its neighbours still shared one.
    assert writers(attempts[1]) == writers(attempts[2])


def other_connection(autocommit=False) -> psycopg.Connection:
    params = connection.get_connection_params()
    return psycopg.connect(dbname=connection.settings_dict["NAME"], autocommit=autocommit, **{
        k: v for k, v in params.items() if k in ("host", "port", "user")})


def test_deleting_a_job_waits_for_a_batch_in_flight_and_deletes_its_points(attempts):
    """Metric points have no foreign key to their attempt: a batch locks the
    attempt for its statement instead, and the deletion locks it first
    (jobs/receivers.py). A batch written but not yet committed when the
    deletion starts must not be left behind, nor fail the deletion."""
    attempt = attempts[0]
    batch = ingest._Batch(attempt.job_id, attempt.pk, rows())
    with other_connection() as writer, other_connection(autocommit=True) as watcher:
        stored = writer.execute(ingest._PG_STORE, ingest._params([batch])).fetchall()
        assert [alive for _, alive, _ in stored] == [True]
        outcome = {}

        def delete():
            try:
                attempt.job.delete()
                outcome["ok"] = True
            except Exception as exc:  # the test asserts on it
                outcome["error"] = exc
            finally:
                connection.close()

        deleter = threading.Thread(target=delete)
        deleter.start()
        def deletion_waits():
            assert deleter.is_alive(), outcome
            return waiting_on_a_lock(watcher)

        eventually(deletion_waits, timeout=30, what="the deletion waiting on the batch's lock")
        writer.commit()
        deleter.join(timeout=60)
    assert outcome == {"ok": True}
    assert not MetricPoint.objects.filter(attempt_id=attempt.pk).exists()
    assert not MetricRollup.objects.filter(attempt_id=attempt.pk).exists()
    # The other attempts keep theirs; a batch for the deleted one is refused.
    with pytest.raises(ingest.AttemptGone):
        ingest.store(attempt.job_id, attempt.pk, rows(step=50), received=10)
    assert not MetricPoint.objects.filter(attempt_id=attempt.pk).exists()
