"""The real cluster reconciler replacing nodes of an Auto Scaling group.

Neither AWS nor a Kubernetes API server can run here: moto's server on
127.0.0.1 stands in for EC2 Auto Scaling, EC2 and SQS (real HTTP, real
boto3; it launches a new instance when one is terminated without lowering
the desired capacity, as AWS does), and tests/support/k8s_standin.py for the
API server. clusters.reconcile.reconcile_cluster runs as in production
against a real database; the test plays the kubelet by registering a new
instance's Node once it "boots".
"""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from clusters.providers.aws import instance_id
from clusters.reconcile import reconcile_cluster
from tests.clusters.test_aws_provider import counts, desired, queue, sns_envelope, spot_event
from tests.fleet_helpers import later
from tests.support import k8s_standin as st
from tests.support.aws_standin import (  # noqa: F401  (fixtures)
    REGION,
    aws,
    client,
    group_instances,
    make_group,
    moto_url,
    unique,
)

GROUP = {"eks.amazonaws.com/nodegroup": "h100"}


@pytest.fixture
def standin():
    with st.K8sStandIn() as server:
        yield server


def instances(url, ids):
    reply = client("ec2", url).describe_instances(InstanceIds=list(ids))
    return {i["InstanceId"]: i for r in reply["Reservations"] for i in r["Instances"]}


def register(standin, url, ids):
    """The kubelet of each instance registers its Node, named as EKS names it."""
    for iid, inst in instances(url, ids).items():
        standin.put(st.NODES, st.node(inst["PrivateDnsName"], instance=iid, labels=GROUP))


@pytest.fixture
def fleet(db, aws, standin):  # noqa: F811
    """A Kubernetes cluster whose pool is an Auto Scaling group of three:
    two working nodes and a spare, all registered and ready."""
    group = unique("h100-nodes")
    ids = make_group(aws, group, size=3, max_size=6)
    sqs, spot_url = queue(aws)
    cluster = Cluster.objects.create(
        name=unique("eks"), provider=Cluster.Provider.KUBERNETES,
        settings={"api_url": standin.url, "request_timeout_s": 5, "region": REGION,
                  "endpoint_url": aws, "preflight": "dcgm-labels"},
    )
    pool = NodePool.objects.create(
        cluster=cluster, name="h100", instance_type="p5.48xlarge", gpus_per_node=8, size=2,
        spare_count=1, node_selector=GROUP,
        settings={"asg_name": group, "replace_timeout_s": 10, "replace_poll_s": 0.1,
                  "spot_queue_url": spot_url},
    )
    register(standin, aws, ids)
    now = timezone.now()
    reconcile_cluster(cluster.id, now)
    return {"cluster": cluster, "pool": pool, "group": group, "ids": ids, "now": now,
            "sqs": sqs, "spot_url": spot_url}


def by_instance(cluster):
    return {instance_id(n.provider_id): n for n in Node.objects.filter(cluster=cluster)}


def check_replaced(aws, standin, fleet, old, before, now):  # noqa: F811
    """The old node retired, its instance terminated without shrinking the
    group, and the group's new instance (not among `before`) a new spare row,
    which turns ready once it registers and not before."""
    cluster, group = fleet["cluster"], fleet["group"]
    old.refresh_from_db()
    assert old.state == Node.State.REPLACED
    gone = instance_id(old.provider_id)
    members = group_instances(aws, group)
    assert gone not in members
    assert len(members) == len(before) and desired(aws, group) == len(before)
    assert instances(aws, [gone])[gone]["State"]["Name"] in ("shutting-down", "terminated")
    assert standin.get(st.NODES, old.name) is None

    (fresh_id,) = set(members) - set(before)
    new = by_instance(cluster)[fresh_id]
    assert new.is_spare and new.state == Node.State.PROVISIONING
    assert new.name == instances(aws, [fresh_id])[fresh_id]["PrivateDnsName"]
    assert new.events.get(to_state="provisioning").reason == f"provisioned to replace {old.name}"

    # Still booting on the next sweep: the row waits instead of being called gone.
    reconcile_cluster(cluster.id, later(now, 30))
    new.refresh_from_db()
    assert new.state == Node.State.PROVISIONING
    register(standin, aws, [fresh_id])
    reconcile_cluster(cluster.id, later(now, 60))
    new.refresh_from_db()
    assert new.state == Node.State.READY and new.is_spare


def test_the_pool_starts_as_two_working_nodes_and_a_spare(fleet):
    rows = by_instance(fleet["cluster"])
    assert set(rows) == set(fleet["ids"])
    assert all(n.state == Node.State.READY and n.gpus == 8 for n in rows.values())
    assert sorted(n.is_spare for n in rows.values()) == [False, False, True]


def test_an_operators_replacement_goes_through_the_auto_scaling_group(aws, standin, fleet):  # noqa: F811
    cluster, now = fleet["cluster"], fleet["now"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    Node.objects.filter(pk=old.pk).update(replace_requested_at=now)

    reconcile_cluster(cluster.id, later(now, 1))

    promoted = Node.objects.get(cluster=cluster, replaces=old)
    assert not promoted.is_spare and promoted.state == Node.State.READY
    check_replaced(aws, standin, fleet, old, fleet["ids"], later(now, 1))
    assert Node.objects.filter(cluster=cluster, state=Node.State.READY).count() == 3


def test_a_node_whose_node_object_vanished_is_still_replaced(aws, standin, fleet):  # noqa: F811
    """The Node object went (deleted by hand, or the kubelet lost its
    registration) while the instance runs on in the group: the instance must
    still be terminated, or the group never brings up another."""
    cluster, now = fleet["cluster"], fleet["now"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    del standin.store[st.NODES][old.name]

    reconcile_cluster(cluster.id, later(now, 1))
    old.refresh_from_db()
    assert old.state == Node.State.FAILED  # the group still has it, Kubernetes does not
    # Its place was taken by the spare, and a spare was added: the group grew.
    before = group_instances(aws, fleet["group"])
    assert len(before) == 4 and instance_id(old.provider_id) in before
    Node.objects.filter(pk=old.pk).update(replace_requested_at=later(now, 2))

    reconcile_cluster(cluster.id, later(now, 2))

    check_replaced(aws, standin, fleet, old, before, later(now, 2))


def test_a_spot_notice_for_an_idle_node_replaces_it(aws, standin, fleet):  # noqa: F811
    cluster, now, sqs, url = fleet["cluster"], fleet["now"], fleet["sqs"], fleet["spot_url"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(instance_id(old.provider_id)))

    reconcile_cluster(cluster.id, later(now, 1))

    (event,) = NodeHealthEvent.objects.filter(node=old)
    assert (event.kind, event.severity) == ("spot_notice", "critical")
    assert event.handled_at is not None
    assert event.evidence["detail"]["instance-action"] == "terminate"
    assert counts(sqs, url) == (0, 0)
    check_replaced(aws, standin, fleet, old, fleet["ids"], later(now, 1))
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 1


def test_an_sns_wrapped_notice_and_the_nth_taint_are_one_interruption(aws, standin, fleet):  # noqa: F811
    """EventBridge -> SNS -> SQS, and Node Termination Handler's taint on the
    same node (TAINT_NODE=true): one health event, one replacement."""
    cluster, now, sqs, url = fleet["cluster"], fleet["now"], fleet["sqs"], fleet["spot_url"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    iid = instance_id(old.provider_id)
    standin.get(st.NODES, old.name)["spec"]["taints"] = [
        {"key": "aws-node-termination-handler/spot-itn", "value": "1700000000",
         "effect": "NoSchedule", "timeAdded": "2026-01-05T10:00:02Z"}]
    sqs.send_message(QueueUrl=url, MessageBody=sns_envelope(spot_event(iid)))

    reconcile_cluster(cluster.id, later(now, 1))

    (event,) = NodeHealthEvent.objects.filter(node=old)
    assert event.kind == "spot_notice" and event.evidence["key"] == f"spot-interruption/{iid}"
    assert counts(sqs, url) == (0, 0)
    check_replaced(aws, standin, fleet, old, fleet["ids"], later(now, 1))
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 1
