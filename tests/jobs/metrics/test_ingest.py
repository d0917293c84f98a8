"""Metric ingestion (jobs/metrics/ingest.py), its rollups and names (jobs/metrics/rollups.py),
the series read from them (jobs/metrics/series.py), and worker tokens checked with no
read (jobs/worker_api/auth.py): over real HTTP handling and the real database
(PostgreSQL when DATABASE_URL is set, else SQLite)."""

from collections import defaultdict

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.metrics import ingest, rollups
from jobs.metrics.models import MetricName, MetricPoint, MetricRollup
from jobs.metrics.series import series
from jobs.models import JobAttempt, RankStatus
from tests.api_factories import make_attempt, make_job, worker_client


def url(attempt, endpoint):
    return f"/api/v1/worker/attempts/{attempt.pk}/{endpoint}"


def send(token, attempt, points):
    body = {"points": [{"rank": r, "name": n, "step": s, "value": v} for r, n, s, v in points]}
    return worker_client(token).post(url(attempt, "metrics"), body, format="json")


def store(attempt, points):
    rows = [(r, n, s, v, None) for r, n, s, v in points]
    return ingest.store(attempt.job_id, attempt.pk, rows, received=len(rows))


def statements(ctx) -> list:
    """The queries a request ran, less the savepoints of the test's transaction."""
    return [q for q in ctx.captured_queries
            if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]


def expected_rollups(attempt) -> dict:
    """Every bucket of every level, aggregated here from the raw points."""
    out = {}
    groups = defaultdict(list)
    for rank, name, step, value in MetricPoint.objects.filter(attempt=attempt).values_list(
            "rank", "name", "step", "value"):
        for level in rollups.LEVELS:
            groups[(name, rank == 0, level, step // level)].append((step, rank, value))
    for key, points in groups.items():
        steps = [s for s, _, _ in points]
        values = [v for _, _, v in points]
        last = min((p for p in points if p[0] == max(steps)), key=lambda p: p[1])[2]
        out[key] = (min(steps), max(steps), min(values), max(values), pytest.approx(sum(values)),
                    len(points), last)
    return out


def stored_rollups(attempt) -> dict:
    return {
        (r.name, r.rank0, r.level, r.bucket): (r.s0, r.s1, r.vmin, r.vmax, r.vsum, r.n, r.vlast)
        for r in MetricRollup.objects.filter(attempt=attempt)
    }


class TestExactlyOnce:
    def test_the_same_batch_sent_twice_stores_and_rolls_up_once(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        batch = [(0, "loss", s, 1.0 / s) for s in range(1, 41)]
        first, again = send(token, attempt, batch), send(token, attempt, batch)
        assert first.json() == {"stored": 40, "duplicates": 0}
        assert again.json() == {"stored": 0, "duplicates": 40}
        assert MetricPoint.objects.filter(attempt=attempt).count() == 40
        assert stored_rollups(attempt) == expected_rollups(attempt)

    def test_overlapping_batches_out_of_order_roll_up_as_the_raw_points_do(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        # Later steps first, overlaps, two names, and ranks 0 and 1 (the
        # rollups keep rank 0 apart), across bucket edges of every level.
        send(token, attempt, [(0, "loss", s, (s % 7) - 3.0) for s in range(17_000, 17_100)])
        send(token, attempt, [(0, "loss", s, s * 0.5) for s in range(1, 300, 3)])
        send(token, attempt, [(0, "loss", s, -s) for s in range(250, 400)])
        send(token, attempt, [(r, "lr", s, 0.1 * r) for r in (0, 1) for s in range(60, 70)])
        assert stored_rollups(attempt) == expected_rollups(attempt)

    def test_the_rebuild_from_raw_points_gives_the_rollups_ingest_kept(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        send(token, attempt, [(r, "loss", s, s * (r + 1.5)) for r in (0, 2) for s in range(1, 90)])
        send(token, attempt, [(0, "loss", s, -1.0) for s in range(80, 200)])
        kept = stored_rollups(attempt)
        assert rollups.rebuild([attempt.pk]) == len(kept)
        assert stored_rollups(attempt) == kept

    # Committed as the server commits: the foreign keys are checked at commit.
    @pytest.mark.django_db(transaction=True)
    def test_a_batch_for_an_attempt_that_is_gone_is_refused_and_writes_nothing(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        JobAttempt.objects.filter(pk=attempt.pk).delete()
        resp = send(token, attempt, [(0, "loss", 1, 1.0)])
        assert resp.status_code == 401
        assert not MetricPoint.objects.exists() and not MetricRollup.objects.exists()
        assert not MetricName.objects.exists()


class TestNames:
    def test_a_job_has_one_names_row_per_metric_whatever_the_batches(self, api, owner,
                                                                      reporting_job):
        attempt, token = make_attempt(reporting_job)
        for lo in range(1, 50, 10):
            send(token, attempt, [(0, "loss", s, 1.0) for s in range(lo, lo + 10)])
        send(token, attempt, [(3, "grad_norm", 1, 1.0)])
        assert MetricName.objects.filter(job=reporting_job).count() == 2
        data = api(owner).get(f"/api/v1/jobs/{reporting_job.pk}/metrics/names/").data
        assert data == {"names": ["grad_norm", "loss"]}

    def test_the_names_are_rebuilt_from_the_raw_points(self, reporting_job):
        attempt, _ = make_attempt(reporting_job)
        MetricPoint.objects.create(job=reporting_job, attempt=attempt, name="mfu", step=1,
                                   value=0.4, time=attempt.created_at)
        assert rollups.rebuild_names() == 1
        assert list(MetricName.objects.values_list("job_id", "name")) == [(reporting_job.pk, "mfu")]


class TestLongSeries:
    def test_a_rollback_hides_the_replaced_steps_exactly_in_a_long_series(self, reporting_job):
        first, _ = make_attempt(reporting_job, state=JobAttempt.State.FAILED)
        second, _ = make_attempt(reporting_job)
        JobAttempt.objects.filter(pk=second.pk).update(resume_step=20_000)
        # The first attempt got to 30,000 with a spike at 25,000, then
        # rolled back to 20,000: the spike is no longer part of the run.
        store(first, [(0, "loss", s, 50.0 if s == 25_000 else 1.0) for s in range(1, 30_001)])
        store(second, [(0, "loss", s, 60.0 if s == 40_000 else 2.0)
                       for s in range(20_001, 45_001)])
        out = series(reporting_job.pk, "loss", 300)
        assert out["total"] == 45_000
        assert all(v == (1.0 if s <= 20_000 else 2.0) or v == 60.0 for s, v in out["points"])
        assert max(v for _, v in out["points"]) == 60.0

    def test_rank_0_speaks_for_the_job_in_a_long_series(self, reporting_job):
        attempt, _ = make_attempt(reporting_job)
        store(attempt, [(r, "loss", s, float(r)) for r in (0, 1) for s in range(1, 25_001)])
        out = series(reporting_job.pk, "loss", 200)
        assert out["total"] == 25_000 and {v for _, v in out["points"]} == {0.0}


class TestQueryCounts:
    def test_a_metrics_post_is_one_statement_on_postgresql(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        client = worker_client(token)
        body = {"points": [{"rank": 0, "name": "loss", "step": s, "value": 1.0}
                           for s in range(1, 501)]}
        with CaptureQueriesContext(connection) as ctx:
            assert client.post(url(attempt, "metrics"), body, format="json").status_code == 200
        # No read for the token; PostgreSQL: the attempt's check, the points,
        # rollups and names in one statement; SQLite: the same four one by one.
        assert len(statements(ctx)) == (1 if connection.vendor == "postgresql" else 4)

    def test_a_heartbeat_reads_nothing_it_does_not_write(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        body = {"rank": 1, "node": "", "step": 5}
        worker_client(token).post(url(attempt, "heartbeat"), body, format="json")
        with CaptureQueriesContext(connection) as ctx:
            resp = worker_client(token).post(url(attempt, "heartbeat"), body, format="json")
        assert resp.status_code == 200
        # PostgreSQL: one statement (the attempt's row returning the
        # directives, the rank's row); SQLite: those two one by one.
        assert len(statements(ctx)) == (1 if connection.vendor == "postgresql" else 2)

    def test_a_rank_0_first_step_beat_is_one_statement_on_postgresql(self, reporting_job, cluster):
        from jobs.models import AttemptNode

        attempt, token = make_attempt(reporting_job)
        node = cluster.nodes.first()
        AttemptNode.objects.create(attempt=attempt, node=node, node_rank=0)
        body = {"rank": 0, "node": node.name, "step": 1, "tokens_per_s": 10.0}
        with CaptureQueriesContext(connection) as ctx:
            resp = worker_client(token).post(url(attempt, "heartbeat"), body, format="json")
        assert resp.status_code == 200
        # The attempt (its first step), the rank, the node and the job's
        # progress: one statement on PostgreSQL; SQLite adds the first step,
        # the node and the job's progress one by one.
        assert len(statements(ctx)) == (1 if connection.vendor == "postgresql" else 5)
        attempt.refresh_from_db()
        reporting_job.refresh_from_db()
        node.refresh_from_db()
        assert attempt.first_step_at is not None and attempt.last_step == 1
        assert reporting_job.current_step == 1 and reporting_job.progress["tokens_per_s"] == 10.0
        assert node.last_heartbeat_at == attempt.first_step_at

    def test_a_long_series_costs_the_same_queries_however_long(self, reporting_job,
                                                              django_assert_num_queries):
        attempt, _ = make_attempt(reporting_job)
        store(attempt, [(0, "loss", s, 1.0) for s in range(1, 30_001)])
        # Attempts, the rank-0 probe, the coarse summary, the buckets, and the
        # points of the job's eval runs (jobs/evals/).
        with django_assert_num_queries(5):
            assert series(reporting_job.pk, "loss", 300)["total"] == 30_000
        store(attempt, [(0, "loss", s, 1.0) for s in range(30_001, 90_001)])
        with django_assert_num_queries(5):
            assert series(reporting_job.pk, "loss", 300)["total"] == 90_000


class TestTokens:
    def test_an_ended_attempt_is_told_to_stop_on_its_very_next_beat(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        client = worker_client(token)
        beat = {"rank": 0, "node": "", "step": 3}
        assert client.post(url(attempt, "heartbeat"), beat, format="json").status_code == 200
        attempt.end(JobAttempt.State.STOPPED, attempt.created_at)
        resp = client.post(url(attempt, "heartbeat"), {**beat, "step": 4}, format="json")
        assert resp.status_code == 403 and resp.json()["stop"] is True
        assert RankStatus.objects.get(attempt=attempt).step == 3

    def test_a_gone_attempts_heartbeat_is_unauthorised(self, reporting_job):
        attempt, token = make_attempt(reporting_job)
        JobAttempt.objects.filter(pk=attempt.pk).delete()
        resp = worker_client(token).post(url(attempt, "heartbeat"), {"rank": 0, "step": 1},
                                         format="json")
        assert resp.status_code == 401
        assert not RankStatus.objects.exists()

    def test_a_token_with_another_job_written_into_it_is_refused(self, reporting_job, team,
                                                                 cluster):
        attempt, token = make_attempt(reporting_job)
        other = make_job(team, cluster, name="other")
        forged = token.replace(f"_{reporting_job.pk}_", f"_{other.pk}_", 1)
        assert forged != token
        assert send(forged, attempt, [(0, "loss", 1, 1.0)]).status_code == 401
        assert not MetricPoint.objects.exists()

    def test_a_token_in_the_earlier_format_is_still_accepted(self, reporting_job):
        from jobs.models import hash_token
        from jobs.worker_api.tokens import make

        attempt, _ = make_attempt(reporting_job)
        mac = make(attempt.pk, reporting_job.pk, attempt.number).rsplit("_", 1)[1]
        legacy = f"rgw_{attempt.pk}_{mac}"
        JobAttempt.objects.filter(pk=attempt.pk).update(token_hash=hash_token(legacy))
        assert send(legacy, attempt, [(0, "loss", 1, 1.0)]).json() == {"stored": 1,
                                                                       "duplicates": 0}
