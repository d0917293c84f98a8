"""The cluster reconciler over a real Slurm: nodes come from the partition,
and a node whose slurmd dies is taken out of service with Slurm's own
evidence, drained in Slurm too, and a spare takes its place."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from clusters.reconcile import reconcile_cluster_unlocked
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.django_db]


def slurm_cluster(slurm_world, tmp_path) -> Cluster:
    cluster = Cluster.objects.create(
        name="hpc", provider=Cluster.Provider.SLURM,
        settings={"slurm_conf": slurm_world.conf, "partition": "gpu",
                  "shared_dir": str(tmp_path / "shared"), "preflight": False,
                  "node_failure_grace_s": 3})
    NodePool.objects.create(cluster=cluster, name="gpu", instance_type="slurm", gpus_per_node=2,
                            size=3, spare_count=1)
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    return cluster


def test_the_partitions_nodes_join_as_working_nodes_and_a_spare(slurm_world, tmp_path):
    cluster = slurm_cluster(slurm_world, tmp_path)

    nodes = Node.objects.filter(cluster=cluster).order_by("name")
    assert [(n.name, n.state, n.is_spare, n.gpus) for n in nodes] == [
        ("n1", "ready", False, 2), ("n2", "ready", False, 2), ("n3", "ready", False, 2),
        ("n4", "ready", True, 2)]
    assert nodes[0].provider_id == "slurm://n1"


def test_a_node_whose_slurmd_dies_is_cordoned_with_slurms_evidence(slurm_world, tmp_path,
                                                                    admin_client):
    cluster = slurm_cluster(slurm_world, tmp_path)

    slurm_world.lose_node("n2")

    def taken_out():
        reconcile_cluster_unlocked(cluster.id, timezone.now())
        return Node.objects.get(cluster=cluster, name="n2").state not in ("ready", "failed")

    eventually(taken_out, timeout=90, interval=1.0, what="the pass to take n2 out")
    event = NodeHealthEvent.objects.get(node__name="n2", kind="lost")
    assert event.severity == "critical"
    # Not responding past the grace (3 s here): before Slurm's own DOWN.
    assert "NOT_RESPONDING" in event.evidence["provider_status"]["State"] or (
        "DOWN" in event.evidence["provider_status"]["State"])
    assert event.handled_at is not None
    # Drained in Slurm too, with Regatta's reason beside Slurm's DOWN.
    state = slurm_world.node("n2")
    assert "DRAIN" in state["State"] and state["Reason"].startswith("regatta: ")
    # The spare works in n2's place.
    spare = Node.objects.get(cluster=cluster, name="n4")
    assert (spare.is_spare, spare.state) == (False, "ready")
    # One loss, one event, however many passes look at it.
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    assert NodeHealthEvent.objects.filter(node__name="n2", kind="lost").count() == 1
    # Operators see Slurm's own word beside Regatta's: on the node's page,
    # and on the fleet page's tiles of the nodes in service.
    lost = Node.objects.get(cluster=cluster, name="n2")
    assert "DRAIN" in lost.provider_status["State"]
    assert lost.provider_status["Reason"].startswith("regatta: ")
    page = admin_client.get(reverse("frontend:node", args=[lost.pk])).content.decode()
    assert lost.provider_summary in page and "DRAIN" in lost.provider_summary
    assert Node.objects.get(cluster=cluster, name="n1").provider_summary == "IDLE"
    fleet_page = admin_client.get(reverse("frontend:fleet")).content.decode()
    assert 'title="n1: ready — provider reports it ready · provider: IDLE"' in fleet_page


def test_the_spare_is_held_in_a_reservation_that_only_regattas_jobs_use(slurm_world, tmp_path):
    """Left in the partition, an idle spare is the next job's to take.
    The pass keeps it in a Slurm reservation of its own; once it is
    promoted into a lost node's place, it leaves the reservation."""
    cluster = slurm_cluster(slurm_world, tmp_path)

    held = slurm_world.reservations()["regatta-hpc-gpu-spares"]
    assert held["Nodes"] == "n4" and held["Users"] == "root", held
    # Somebody else's job asking for n4 by name waits: it is reserved.
    other = slurm_world.run("sbatch", "--parsable", "-p", "gpu", "-w", "n4", "--wrap",
                            "true").strip()
    eventually(lambda: "ReqNodeNotAvail" in slurm_world.job(other)["Reason"], timeout=20,
               interval=0.3, what="the other job to wait for the reserved node")
    slurm_world.run("scancel", other)

    slurm_world.lose_node("n2")

    def promoted():
        reconcile_cluster_unlocked(cluster.id, timezone.now())
        return not Node.objects.get(cluster=cluster, name="n4").is_spare

    eventually(promoted, timeout=60, interval=1.0, what="the spare to take n2's place")
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    assert "regatta-hpc-gpu-spares" not in slurm_world.reservations(), (
        "no spare left: no reservation")


def test_a_spare_slurm_will_not_reserve_for_regatta_stays_a_spare_and_the_pass_goes_on(
        slurm_world, tmp_path):
    """An operator's maintenance reservation on the spare: Slurm refuses a
    second one over it. The pass says so and goes on; the node is still
    Regatta's spare."""
    slurm_world.run("scontrol", "create", "reservation", "ReservationName=maint",
                    "StartTime=now", "Duration=60", "Users=root", "Nodes=n4")
    cluster = slurm_cluster(slurm_world, tmp_path)

    cluster.refresh_from_db()
    assert cluster.last_error == ""
    assert Node.objects.get(cluster=cluster, name="n4").is_spare
    assert set(slurm_world.reservations()) == {"maint"}
