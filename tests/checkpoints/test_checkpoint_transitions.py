"""A checkpoint's state has one owner, `Checkpoint.transition` and
`Checkpoint.transition_many` over the table `Checkpoint.TRANSITIONS`: every
move the table forbids is refused, every one it allows is made, two movers
racing for a row move it once, and each caller (verification, retention,
abandoning a branch, a replayed report) moves rows only through them."""

import threading
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from checkpoints.models import Checkpoint
from checkpoints.verification import verify
from controlplane.lib.errors import IllegalTransition
from jobs.checkpointing import abandon_branch, open_job_storage, prune
from jobs.models import JobEvent
from jobs.worker_api.reports import record_checkpoint
from tests.api_factories import make_attempt, make_checkpoint, make_job
from tests.fleet_helpers import write_checkpoint

S = Checkpoint.State
MOVES = [(source, target) for source in S for target in S]


@pytest.fixture
def job(team, cluster):
    return make_job(team, cluster, keep_last=1)


def row(checkpoint) -> tuple[str, str]:
    return tuple(Checkpoint.objects.filter(pk=checkpoint.pk)
                 .values_list("state", "state_reason").get())


# --- the table -----------------------------------------------------------------

def test_the_table_names_every_state_and_only_states():
    assert set(Checkpoint.TRANSITIONS) == set(S)
    assert all(set(sources) <= set(S) for sources in Checkpoint.TRANSITIONS.values())


@pytest.mark.parametrize(("source", "target"), [
    m for m in MOVES if m[0] in Checkpoint.TRANSITIONS[m[1]]])
def test_every_move_the_table_allows_is_made(job, source, target):
    checkpoint = make_checkpoint(job, 10, state=source)
    assert checkpoint.transition(target, reason="why") is True
    assert row(checkpoint) == (target, "why")
    assert (checkpoint.state, checkpoint.state_reason) == (target, "why")


@pytest.mark.parametrize(("source", "target"), [
    m for m in MOVES if m[0] not in Checkpoint.TRANSITIONS[m[1]]])
def test_every_move_the_table_forbids_is_refused(job, source, target):
    checkpoint = make_checkpoint(job, 10, state=source)
    with pytest.raises(IllegalTransition) as refused:
        checkpoint.transition(target, reason="why")
    assert (refused.value.kind, refused.value.obj_id) == ("checkpoint", checkpoint.pk)
    assert (refused.value.current, refused.value.target) == (source, target)
    assert row(checkpoint) == (source, "")


def test_a_bulk_move_takes_the_rows_the_table_allows_and_leaves_the_others(job):
    rows = {state: make_checkpoint(job, step, state=state)
            for step, state in enumerate(S, start=1)}
    moved = Checkpoint.transition_many(Checkpoint.objects.filter(job=job), S.ABANDONED,
                                       reason="left")
    movable = Checkpoint.TRANSITIONS[S.ABANDONED]
    assert {c.pk for c in moved} == {rows[s].pk for s in movable}
    assert all((c.state, c.state_reason) == (S.ABANDONED, "left") for c in moved)
    for state, checkpoint in rows.items():
        assert row(checkpoint) == ((S.ABANDONED, "left") if state in movable else (state, ""))


def test_a_bulk_move_to_a_state_nothing_moves_to_is_refused(job):
    checkpoint = make_checkpoint(job, 10)
    with pytest.raises(IllegalTransition):
        Checkpoint.transition_many(Checkpoint.objects.filter(job=job), S.WRITING, reason="")
    assert row(checkpoint) == (S.COMMITTED, "")


# --- two movers, one wins -----------------------------------------------------------

def test_a_second_mover_holding_the_same_row_finds_it_moved_and_moves_nothing(job):
    checkpoint = make_checkpoint(job, 10, state=S.VERIFIED)
    first, second = Checkpoint.objects.get(pk=checkpoint.pk), Checkpoint.objects.get(
        pk=checkpoint.pk)
    assert first.transition(S.DELETED, reason="retention: keep last 1") is True
    assert second.transition(S.DELETED, reason="retention: keep last 1") is False
    # The loser sees the winner's move, not its own stale read.
    assert (second.state, second.state_reason) == (S.DELETED, "retention: keep last 1")


def test_a_verification_that_lost_its_row_to_a_restart_leaves_it_abandoned(job):
    checkpoint = make_checkpoint(job, 10)
    verifier = Checkpoint.objects.get(pk=checkpoint.pk)  # read before the restart
    Checkpoint.transition_many(Checkpoint.objects.filter(pk=checkpoint.pk), S.ABANDONED,
                               reason="left by the restart from step 5")
    assert verifier.transition(S.VERIFIED, reason="", verified_at=timezone.now()) is False
    assert verifier.state == S.ABANDONED and verifier.verified_at is None
    assert row(checkpoint) == (S.ABANDONED, "left by the restart from step 5")


def test_a_second_bulk_move_over_the_same_rows_moves_nothing(job):
    for step in (10, 20):
        make_checkpoint(job, step)
    rows = Checkpoint.objects.filter(job=job)
    assert len(Checkpoint.transition_many(rows, S.ABANDONED, reason="left")) == 2
    assert Checkpoint.transition_many(rows, S.ABANDONED, reason="left") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_movers_racing_in_threads_for_one_row_move_it_once(team, cluster):
    """Real threads, each with its own connection: row locks on PostgreSQL,
    IMMEDIATE transactions on SQLite."""
    checkpoint = make_checkpoint(make_job(team, cluster), 10)
    movers = 4
    start = threading.Barrier(movers)
    moved, errors = [], []

    def move(i):
        try:
            mine = Checkpoint.objects.get(pk=checkpoint.pk)
            start.wait(timeout=30)
            moved.append(mine.transition(S.DELETED, reason=f"mover {i}"))
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=move, args=(i,)) for i in range(movers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert errors == []
    assert sorted(moved) == [False] * (movers - 1) + [True]
    assert Checkpoint.objects.get(pk=checkpoint.pk).state == S.DELETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_bulk_move_waiting_on_another_s_uncommitted_move_finds_the_rows_moved(
        team, cluster):
    """The second pass reads the rows while the first has moved them but not
    committed: it must wait for the first and then take none, not report
    rows it never moved (abandon_branch writes its event from what moved)."""
    if connection.vendor != "postgresql":
        pytest.skip("waits on row locks, which only PostgreSQL has (SQLite queues "
                    "whole transactions: the thread test above)")
    job = make_job(team, cluster)
    for step in (10, 20, 30):
        make_checkpoint(job, step)
    rows = Checkpoint.objects.filter(job=job, step__gt=15)
    holding, release = threading.Event(), threading.Event()
    results, errors = {}, []

    def first():
        try:
            with transaction.atomic():
                results["first"] = Checkpoint.transition_many(rows, S.ABANDONED, reason="first")
                holding.set()
                release.wait(timeout=60)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    def second():
        try:
            results["second"] = Checkpoint.transition_many(rows, S.ABANDONED, reason="second")
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(timeout=60)
    two = threading.Thread(target=second)
    two.start()
    deadline = time.monotonic() + 30
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                           " AND wait_event_type = 'Lock'")
            if cursor.fetchone():
                break
            assert time.monotonic() < deadline and two.is_alive(), (results, errors)
            time.sleep(0.02)
    release.set()
    one.join(timeout=60)
    two.join(timeout=60)
    assert errors == []
    assert sorted(c.step for c in results["first"]) == [20, 30]
    assert results["second"] == []
    assert dict(Checkpoint.objects.filter(job=job).values_list("step", "state_reason")) == {
        10: "", 20: "first", 30: "first"}


# --- each caller's move ------------------------------------------------------------

@pytest.fixture
def stored_job(job, fleet_dirs):
    return job


def test_verification_marks_a_good_checkpoint_verified(stored_job):
    now = timezone.now()
    checkpoint = write_checkpoint(stored_job, 10)
    assert verify(checkpoint, open_job_storage(stored_job), now) == (True, "ok")
    assert row(checkpoint) == (S.VERIFIED, "ok")
    assert checkpoint.state == S.VERIFIED and checkpoint.verified_at == now


def test_verification_marks_a_checkpoint_without_its_marker_corrupt(stored_job):
    checkpoint = write_checkpoint(stored_job, 10)
    (Path(checkpoint.uri.removeprefix("file://")) / "COMMITTED").unlink()
    ok, reason = verify(checkpoint, open_job_storage(stored_job))
    assert ok is False and "COMMITTED" in reason
    assert row(checkpoint) == (S.CORRUPT, reason)
    assert checkpoint.state == S.CORRUPT and checkpoint.verified_at is None


def test_verification_of_a_row_abandoned_while_its_files_were_read_leaves_it_so(stored_job):
    checkpoint = write_checkpoint(stored_job, 10)
    abandon_branch(stored_job, 5, before_attempt=1, now=timezone.now())
    assert checkpoint.state == S.COMMITTED  # as the verifier read it
    assert verify(checkpoint, open_job_storage(stored_job)) == (True, "ok")
    assert row(checkpoint) == (S.ABANDONED, "left by the restart from step 5")
    assert checkpoint.state == S.ABANDONED


def test_retention_marks_what_it_deleted_with_its_reason(stored_job):
    old, new = write_checkpoint(stored_job, 10), write_checkpoint(stored_job, 20)
    assert prune(stored_job, timezone.now()) == [10]
    assert row(old) == (S.DELETED, "retention: keep last 1")
    assert row(new) == (S.COMMITTED, "")
    assert stored_job.events.filter(kind="CheckpointsDeleted").count() == 1


def test_abandoning_a_branch_moves_the_older_attempts_rows_past_the_step_once(job):
    old, _ = make_attempt(job, number=1)
    new, _ = make_attempt(job, number=2)
    kept = make_checkpoint(job, 10, attempt=old)
    past = [make_checkpoint(job, 20, attempt=old), make_checkpoint(job, 30),
            make_checkpoint(job, 40, state=S.VERIFIED, attempt=old)]
    gone = make_checkpoint(job, 50, state=S.DELETED, attempt=old)
    newer = make_checkpoint(job, 60, attempt=new)
    now = timezone.now()

    assert abandon_branch(job, 10, before_attempt=2, now=now) == [20, 30, 40]
    for checkpoint in past:
        assert row(checkpoint) == (S.ABANDONED, "left by the restart from step 10")
    assert row(kept) == (S.COMMITTED, "")
    assert row(gone) == (S.DELETED, "")
    assert row(newer) == (S.COMMITTED, "")
    event = JobEvent.objects.get(job=job, kind="CheckpointsAbandoned")
    assert event.evidence == {"steps": [20, 30, 40], "restart_step": 10}

    # Asked again (a reconcile that died after the first): nothing moves, no event.
    assert abandon_branch(job, 10, before_attempt=2, now=now) == []
    assert JobEvent.objects.filter(job=job, kind="CheckpointsAbandoned").count() == 1


def report(step, sha="ab" * 32) -> dict:
    return {"step": step, "uri": f"/tmp/ckpt/step-{step}", "bytes": 7,
            "manifest_sha256": sha, "save_seconds": 1.0, "blocking_seconds": 0.5,
            "emergency": False, "request_id": ""}


def test_a_later_attempt_rewriting_an_abandoned_step_commits_it_anew(job):
    first, _ = make_attempt(job, number=1)
    second, _ = make_attempt(job, number=2)
    record_checkpoint(first, report(20))
    Checkpoint.objects.filter(job=job).update(verified_at=timezone.now())
    abandon_branch(job, 10, before_attempt=2, now=timezone.now())

    checkpoint, created = record_checkpoint(second, report(20, sha="cd" * 32))
    assert created is False
    fresh = Checkpoint.objects.get(pk=checkpoint.pk)
    assert (fresh.state, fresh.state_reason, fresh.verified_at) == (S.COMMITTED, "", None)
    assert (fresh.attempt, fresh.manifest_sha256) == (second, "cd" * 32)


def test_a_repeated_report_of_a_verified_step_leaves_it_verified(job):
    attempt, _ = make_attempt(job, number=1)
    record_checkpoint(attempt, report(20))
    checkpoint = Checkpoint.objects.get(job=job)
    checkpoint.transition(S.VERIFIED, reason="ok", verified_at=timezone.now())
    record_checkpoint(attempt, report(20))
    assert row(checkpoint) == (S.VERIFIED, "ok")
