"""Placement: a gang kept within one value of the pool's topology label
when one has room for it, recorded on the attempt."""

import pytest
from django.utils import timezone

from clusters.models import Node, NodePool
from jobs.admission import placement
from jobs.models import JobAttempt, JobEvent
from tests.fleet_helpers import launch, memory_cluster, submit, team_with_quota

pytestmark = pytest.mark.usefixtures("fleet_dirs")

RACKS = ["a", "a", "a", "b", "b", "c"]


@pytest.fixture
def racked(db):
    cluster = memory_cluster(size=6, spares=0)
    NodePool.objects.filter(cluster=cluster).update(settings={"topology_label": "rack"})
    for node, rack in zip(Node.objects.filter(cluster=cluster).order_by("name"), RACKS,
                          strict=True):
        Node.objects.filter(pk=node.pk).update(labels={"rack": rack})
    return cluster


def racks_of(attempt):
    return sorted(p.node.labels["rack"] for p in attempt.placements.select_related("node"))


def test_a_gang_takes_the_tightest_rack_that_holds_it_whole(racked):
    team = team_with_quota(racked, gpus=12)
    pair = submit(racked, team, name="pair", nodes=2)
    launch(pair, timezone.now())
    attempt = JobAttempt.objects.get(job=pair)
    assert racks_of(attempt) == ["b", "b"]
    assert attempt.placement == {"label": "rack", "nodes_per_value": {"b": 2}, "values": 1}
    launched = JobEvent.objects.get(job=pair, kind="Launched")
    assert launched.evidence["placement"]["nodes_per_value"] == {"b": 2}
    trio = submit(racked, team, name="trio", nodes=3)
    launch(trio, timezone.now())
    assert racks_of(JobAttempt.objects.get(job=trio)) == ["a", "a", "a"]


def test_a_gang_no_rack_can_hold_spans_the_fewest_racks(racked):
    team = team_with_quota(racked, gpus=12)
    big = submit(racked, team, name="big", nodes=5)
    launch(big, timezone.now())
    attempt = JobAttempt.objects.get(job=big)
    assert racks_of(attempt) == ["a", "a", "a", "b", "b"]
    assert attempt.placement["values"] == 2


def test_without_the_label_nodes_go_by_name():
    class N:
        def __init__(self, i, rack):
            self.id, self.name, self.labels = i, f"n{i}", {"rack": rack}

    nodes = [N(i, r) for i, r in enumerate(RACKS)]
    assert [n.name for n in placement.order(nodes, "", 2)] == [f"n{i}" for i in range(6)]
    # A relaunch keeps its own node first, then its rack.
    assert [n.name for n in placement.order(nodes, "rack", 2, prefer=[5])][:1] == ["n5"]
