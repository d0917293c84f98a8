"""Slurm's view of a node is the truth the cluster reconcile follows, both
ways, on a real slurmctld and slurmds (tests/support/slurm_cluster.py): a
controller's restart fails no node, an admin's drain takes a node out at
once and their resume brings it back, and a node its owner mended returns
to service after a health check, so the pool does not only shrink."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeEvent, NodePool
from clusters.reconcile import reconcile_cluster_unlocked
from controlplane.lib.errors import TemporaryError
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.django_db]

SPARES = "regatta-hpc-gpu-spares"


def slurm_cluster(slurm_world, tmp_path, **settings) -> Cluster:
    cluster = Cluster.objects.create(
        name="hpc", provider=Cluster.Provider.SLURM,
        settings={"slurm_conf": slurm_world.conf, "partition": "gpu",
                  "shared_dir": str(tmp_path / "shared"), "preflight": False, **settings})
    NodePool.objects.create(cluster=cluster, name="gpu", instance_type="slurm", gpus_per_node=2,
                            size=3, spare_count=1)
    reconcile_cluster_unlocked(cluster.id, timezone.now())
    return cluster


def states(cluster) -> dict[str, tuple[str, bool]]:
    return {n.name: (n.state, n.is_spare)
            for n in Node.objects.filter(cluster=cluster).order_by("name")}


def answering(slurm_world, node: str) -> bool:
    """Slurm has heard from the node's slurmd again (up, not down or silent)."""
    from clusters.providers.slurm.nodes import state_words

    words = state_words(slurm_world.node(node)["State"])
    return not words & {"DOWN", "NOT_RESPONDING", "UNKNOWN", "FAIL"}


def a_pass(cluster) -> bool:
    """One cluster pass now; False when Slurm could not be asked."""
    try:
        reconcile_cluster_unlocked(cluster.id, timezone.now())
    except TemporaryError:
        return False
    return True


def test_a_slurmctld_restart_fails_no_node_and_keeps_the_spares_reserved(slurm_world, tmp_path):
    """Restarted with its state, slurmctld calls every node UNKNOWN for a few
    seconds until the slurmds register again: that is no failure."""
    cluster = slurm_cluster(slurm_world, tmp_path)
    before = states(cluster)
    assert slurm_world.reservations()[SPARES]["Nodes"] == "n4"

    slurm_world.cluster.stop_slurmctld()
    assert not a_pass(cluster), "a pass with slurmctld away is a temporary error"
    time.sleep(3)
    slurm_world.cluster.start_slurmctld()
    seen = set()

    def settled_after_unknown():
        if a_pass(cluster):
            seen.update(n.provider_status.get("State", "")
                        for n in Node.objects.filter(cluster=cluster))
        return "UNKNOWN" in seen and slurm_world.cluster.node_states().get("n1") == "idle"

    eventually(settled_after_unknown, timeout=60, interval=0.2,
               what="passes to see the restart's UNKNOWN, then idle nodes")
    for _ in range(3):
        assert a_pass(cluster)

    assert states(cluster) == before
    assert not NodeEvent.objects.filter(node__cluster=cluster, to_state="failed").exists()
    assert slurm_world.reservations()[SPARES]["Nodes"] == "n4"
    # What the passes saw is on the nodes' timelines, as no failure.
    noted = NodeEvent.objects.filter(node__name="n1", reason__startswith="the provider reports "
                                     "it not ready")
    assert noted.exists()
    assert NodeEvent.objects.filter(node__name="n1",
                                    reason__startswith="ready again after").exists()


def test_a_node_slurm_keeps_down_fails_once_the_grace_has_passed(slurm_world, tmp_path):
    cluster = slurm_cluster(slurm_world, tmp_path, node_failure_grace_s=3)

    slurm_world.lose_node("n2")

    def taken_out():
        a_pass(cluster)
        return Node.objects.get(cluster=cluster, name="n2").state == "replaced"

    eventually(taken_out, timeout=90, interval=1.0, what="the pass to take n2 out")
    n2 = Node.objects.get(cluster=cluster, name="n2")
    failed = n2.events.get(to_state="failed")
    # slurmd silent past the grace: not responding (Slurm's DOWN comes
    # only after its SlurmdTimeout).
    state = failed.evidence["provider_status"]["State"]
    assert "NOT_RESPONDING" in state or "DOWN" in state, state
    assert failed.evidence["not_ready_for_s"] >= 3
    lost = n2.health_events.get(kind="lost")
    assert lost.evidence["provider_status"]["State"] == state
    assert Node.objects.get(cluster=cluster, name="n4").is_spare is False


@pytest.mark.parametrize("how", ["drain", "down"])
def test_an_admins_hold_takes_the_node_out_at_once_and_their_resume_brings_it_back(
        slurm_world, tmp_path, how):
    cluster = slurm_cluster(slurm_world, tmp_path)

    slurm_world.run("scontrol", "update", "nodename=n3", f"state={how}",
                    "reason=rma ticket 7")
    assert a_pass(cluster)

    n3 = Node.objects.get(cluster=cluster, name="n3")
    assert n3.state == Node.State.CORDONED
    assert n3.admin_hold.startswith("rma ticket 7")
    assert n3.state_reason.startswith("held by the scheduler: rma ticket 7")
    assert n3.events.filter(to_state="cordoned", actor="scheduler").exists()
    assert n3.failure_count == 0
    assert not NodeEvent.objects.filter(node=n3, to_state="failed").exists()
    # Out of placement: the spare works in its slot.
    assert states(cluster)["n4"] == ("ready", False)

    slurm_world.run("scontrol", "update", "nodename=n3", "state=resume")
    assert a_pass(cluster)

    n3.refresh_from_db()
    assert (n3.state, n3.is_spare, n3.admin_hold) == (Node.State.READY, True, "")
    assert n3.events.filter(to_state="ready", actor="scheduler",
                            reason__startswith="the scheduler's hold lifted").exists()
    a_pass(cluster)
    assert slurm_world.reservations()[SPARES]["Nodes"] == "n3", "back as the pool's spare"


def test_a_node_its_owner_mended_and_resumed_returns_after_its_health_check(
        slurm_world, tmp_path):
    cluster = slurm_cluster(slurm_world, tmp_path, node_failure_grace_s=2,
                            preflight=True, preflight_mode="state")
    slurm_world.lose_node("n2")
    eventually(lambda: a_pass(cluster) and Node.objects.get(
        cluster=cluster, name="n2").state == "replaced", timeout=90, interval=1.0,
        what="n2 to be replaced")
    assert "DRAIN" in slurm_world.node("n2")["State"]

    # Its owner mends it: slurmd back, then resumed in Slurm.
    slurm_world.cluster.start_slurmd("n2")
    eventually(lambda: answering(slurm_world, "n2"), timeout=60, interval=0.5,
               what="n2's slurmd to register")
    a_pass(cluster)
    assert Node.objects.get(cluster=cluster, name="n2").state == "replaced", (
        "drained with Regatta's reason, it is not back yet")
    slurm_world.run("scontrol", "update", "nodename=n2", "state=resume")

    eventually(lambda: a_pass(cluster) and Node.objects.get(
        cluster=cluster, name="n2").state == "ready", timeout=30, interval=0.5,
        what="n2 to return to service")
    n2 = Node.objects.get(cluster=cluster, name="n2")
    assert n2.is_spare, "its slot was filled meanwhile: it is the pool's spare now"
    back = n2.events.get(to_state="ready", reason__startswith="returned to service")
    assert back.evidence["preflight"]["ok"] is True
    assert n2.events.filter(reason__startswith="return to service asked").exists()
    assert n2.preflight_passed_at is not None
    working = Node.objects.filter(cluster=cluster, is_spare=False, state="ready").count()
    spares = Node.objects.filter(cluster=cluster, is_spare=True, state="ready").count()
    assert (working, spares) == (3, 1), "the pool is whole again"
    a_pass(cluster)
    assert slurm_world.reservations()[SPARES]["Nodes"] == "n2"


def test_an_operator_returns_a_mended_node_through_the_api(slurm_world, tmp_path,
                                                           admin_client):
    # A return gives a node still down 10 s, not 60, to become ready.
    cluster = slurm_cluster(slurm_world, tmp_path, node_failure_grace_s=2, return_settle_s=10)
    slurm_world.lose_node("n2")
    eventually(lambda: a_pass(cluster) and Node.objects.get(
        cluster=cluster, name="n2").state == "replaced", timeout=90, interval=1.0,
        what="n2 to be replaced")
    n2 = Node.objects.get(cluster=cluster, name="n2")
    # Still down: the operator's return is refused by the check, with why.
    answer = admin_client.post(f"/api/v1/nodes/{n2.pk}/return/", {"reason": "fixed"},
                               content_type="application/json")
    assert answer.status_code == 200 and answer.json()["return_requested_at"]
    eventually(lambda: a_pass(cluster) and not Node.objects.get(pk=n2.pk).return_requested_at,
               timeout=90, interval=1.0, what="the return to give up on a node still down")
    n2.refresh_from_db()
    assert n2.state == "replaced" and n2.return_requested_at is None
    assert n2.events.filter(reason__startswith="not returned to service").exists()

    slurm_world.cluster.start_slurmd("n2")
    eventually(lambda: answering(slurm_world, "n2"), timeout=60, interval=0.5,
               what="n2's slurmd to register")
    answer = admin_client.post(f"/api/v1/nodes/{n2.pk}/return/", {"reason": "fixed"},
                               content_type="application/json")
    assert answer.status_code == 200
    eventually(lambda: a_pass(cluster) and not Node.objects.get(pk=n2.pk).return_requested_at,
               timeout=90, interval=1.0, what="the return to be carried out")

    n2.refresh_from_db()
    assert n2.state == "ready", ([e.reason for e in n2.events.order_by("-id")[:3]],
                                 [e.evidence for e in n2.events.order_by("-id")[:1]])
    assert n2.events.get(reason__startswith="returned to service").actor == "user:admin"
    assert "DRAIN" not in slurm_world.node("n2")["State"], "Regatta's drain lifted in Slurm"
    # A node held by an admin in Slurm is theirs to resume.
    slurm_world.run("scontrol", "update", "nodename=n1", "state=drain", "reason=bios update")
    assert a_pass(cluster)
    n1 = Node.objects.get(cluster=cluster, name="n1")
    answer = admin_client.post(f"/api/v1/nodes/{n1.pk}/return/", {},
                               content_type="application/json")
    assert answer.status_code == 409 and "bios update" in answer.json()["detail"]
