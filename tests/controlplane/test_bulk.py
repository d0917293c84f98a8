"""Plain-row inserts and updates (controlplane/lib/bulk.py): COPY on
PostgreSQL, the ORM's bulk_create elsewhere; the rows read back the same
either way. Updates by ids in as few statements as the database's parameter
limit allows (SQLite's 999; PostgreSQL has none)."""

from django.db import transaction
from django.utils import timezone

from clusters.models import Node, NodeEvent
from controlplane.lib.bulk import insert_rows, update_by_ids


def test_rows_are_stored_with_their_json_defaults_and_foreign_keys(pool):
    now = timezone.now()
    insert_rows(Node, [
        {"cluster_id": pool.cluster_id, "pool_id": pool.id, "name": f"bulk-{i}",
         "labels": {"zone": "a", "i": i}, "created_at": now}
        for i in range(3)
    ])
    rows = list(Node.objects.filter(name__startswith="bulk-").order_by("name"))
    assert [r.name for r in rows] == ["bulk-0", "bulk-1", "bulk-2"]
    assert rows[2].labels == {"zone": "a", "i": 2}
    # Left out: the model's defaults.
    assert rows[0].state == Node.State.PROVISIONING and rows[0].gpus == 1
    assert rows[0].failure_count == 0 and rows[0].replaces_id is None
    insert_rows(NodeEvent, [{"node_id": r.id, "to_state": "ready", "reason": "r"}
                            for r in rows])
    assert NodeEvent.objects.filter(node__in=rows, evidence={}, actor="reconciler").count() == 3


def test_conflicting_rows_are_skipped_when_asked_and_the_rest_stored(pool):
    taken = Node.objects.create(cluster=pool.cluster, pool=pool, name="taken", gpus=7)
    insert_rows(Node, [{"cluster_id": pool.cluster_id, "pool_id": pool.id, "name": name,
                        "gpus": 2} for name in ("taken", "fresh")], ignore_conflicts=True)
    taken.refresh_from_db()
    assert taken.gpus == 7  # the row that was there wins
    assert Node.objects.get(name="fresh").gpus == 2


def test_two_inserts_in_one_transaction_do_not_collide(pool):
    with transaction.atomic():
        for batch in ("a", "b"):
            insert_rows(Node, [{"cluster_id": pool.cluster_id, "pool_id": pool.id,
                                "name": f"{batch}-{i}"} for i in range(2)])
    assert Node.objects.filter(name__regex=r"^[ab]-[01]$").count() == 4


def test_an_update_of_no_ids_writes_nothing(pool, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert update_by_ids(Node, [], gpus=3) == 0


def test_an_update_by_ids_past_the_parameter_limit_sets_every_row(pool):
    insert_rows(Node, [{"cluster_id": pool.cluster_id, "pool_id": pool.id, "name": f"u-{i}",
                        "gpus": 1} for i in range(1200)])
    ids = list(Node.objects.filter(name__startswith="u-").values_list("id", flat=True))
    assert update_by_ids(Node, ids, gpus=4) == 1200
    assert set(Node.objects.filter(name__startswith="u-").values_list("gpus", flat=True)) == {4}
