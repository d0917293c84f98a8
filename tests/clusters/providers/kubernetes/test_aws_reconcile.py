"""The real cluster reconciler replacing nodes of an Auto Scaling group.

AWS cannot run here: moto's server on 127.0.0.1 stands in for EC2 Auto
Scaling, EC2 and SQS (real HTTP, real boto3; it launches a new instance when
one is terminated without lowering the desired capacity, as AWS does). The
Kubernetes side is the real test cluster (tests/support/kube_cluster.py),
reached with deploy/'s ServiceAccount token. clusters.reconcile.
reconcile_cluster_unlocked runs as in production against a real database;
the test plays the kubelet by registering a new instance's Node (a kwok
node) once it "boots". What moto's Auto Scaling lacks (scaling
activities, termination lifecycle hooks holding an instance in
`Terminating:Wait`, `CompleteLifecycleAction`, a group that cannot launch)
is served by tests/support/asg_standin.py, a proxy in front of moto's
server that every request of the reconciler goes through.
"""

import pytest
from django.utils import timezone

from clusters.models import Cluster, Node, NodeHealthEvent, NodePool
from clusters.providers.kubernetes.aws_node_groups import instance_id
from clusters.reconcile import reconcile_cluster_unlocked, scaling
from testcluster.fleet import Pool
from tests.fleet_helpers import later
from tests.support.asg_standin import AsgStandIn, activity, insufficient_capacity
from tests.support.aws_standin import (  # noqa: F401  (fixtures)
    REGION,
    aws,
    client,
    group_instances,
    make_group,
    moto_url,
    unique,
)
from tests.support.waiting import eventually

from .test_aws_node_groups import (
    counts,
    desired,
    node_gone,
    queue,
    sns_envelope,
    spot_event,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def instances(url, ids):
    reply = client("ec2", url).describe_instances(InstanceIds=list(ids))
    return {i["InstanceId"]: i for r in reply["Reservations"] for i in r["Instances"]}


def register(world, group, url, ids):
    """The kubelet of each instance registers its Node, named as EKS names it
    and labelled with its node group."""
    names = []
    for iid, inst in instances(url, ids).items():
        zone = inst["Placement"]["AvailabilityZone"]
        names.append(world.fleet.register(group, inst["PrivateDnsName"], f"aws:///{zone}/{iid}"))
        world.made_nodes.append(names[-1])
    eventually(lambda: all(world.fleet.ready(n) for n in names), timeout=30, interval=0.1,
               what="kwok to make the instances' nodes ready")


@pytest.fixture
def asg(aws):  # noqa: F811
    with AsgStandIn(aws) as proxy:
        yield proxy


@pytest.fixture
def fleet(db, aws, kube_world, asg):  # noqa: F811
    """A Kubernetes cluster whose pool is an Auto Scaling group of three:
    two working nodes and a spare, all registered and ready. The node group
    is named as the Auto Scaling group, so a test's nodes are its own on a
    cluster the session shares."""
    group = unique("h100-nodes")
    nodes = Pool(name=group, size=0)
    ids = make_group(aws, group, size=3, max_size=6)
    sqs, spot_url = queue(aws)
    cluster = Cluster.objects.create(
        name=unique("eks"), provider=Cluster.Provider.KUBERNETES,
        settings={"kubeconfig": str(kube_world.regatta_kubeconfig), "request_timeout_s": 5,
                  "region": REGION, "endpoint_url": asg.url, "preflight": "dcgm-labels"},
    )
    pool = NodePool.objects.create(
        cluster=cluster, name="h100", instance_type="p5.48xlarge", gpus_per_node=8, size=2,
        spare_count=1, node_selector=nodes.selector,
        settings={"asg_name": group, "spot_queue_url": spot_url},
    )
    register(kube_world, nodes, aws, ids)
    now = timezone.now()
    reconcile_cluster_unlocked(cluster.id, now)
    return {"cluster": cluster, "pool": pool, "group": group, "nodes": nodes, "ids": ids,
            "now": now, "sqs": sqs, "spot_url": spot_url, "world": kube_world}


def by_instance(cluster):
    return {instance_id(n.provider_id): n for n in Node.objects.filter(cluster=cluster)}


def check_replaced(aws, fleet, old, before, now):  # noqa: F811
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
    assert node_gone(fleet["world"], old.name)

    (fresh_id,) = set(members) - set(before)
    new = by_instance(cluster)[fresh_id]
    assert new.is_spare and new.state == Node.State.PROVISIONING
    assert new.name == instances(aws, [fresh_id])[fresh_id]["PrivateDnsName"]
    assert new.events.get(to_state="provisioning").reason == f"provisioned to replace {old.name}"

    # Still booting on the next sweep: the row waits instead of being called gone.
    reconcile_cluster_unlocked(cluster.id, later(now, 30))
    new.refresh_from_db()
    assert new.state == Node.State.PROVISIONING
    register(fleet["world"], fleet["nodes"], aws, [fresh_id])
    reconcile_cluster_unlocked(cluster.id, later(now, 60))
    new.refresh_from_db()
    assert new.state == Node.State.READY and new.is_spare


def test_the_pool_starts_as_two_working_nodes_and_a_spare(fleet):
    rows = by_instance(fleet["cluster"])
    assert set(rows) == set(fleet["ids"])
    assert all(n.state == Node.State.READY and n.gpus == 8 for n in rows.values())
    assert sorted(n.is_spare for n in rows.values()) == [False, False, True]


def test_an_operators_replacement_goes_through_the_auto_scaling_group(aws, fleet):  # noqa: F811
    cluster, now = fleet["cluster"], fleet["now"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    Node.objects.filter(pk=old.pk).update(replace_requested_at=now)

    reconcile_cluster_unlocked(cluster.id, later(now, 1))

    promoted = Node.objects.get(cluster=cluster, replaces=old)
    assert not promoted.is_spare and promoted.state == Node.State.READY
    check_replaced(aws, fleet, old, fleet["ids"], later(now, 1))
    assert Node.objects.filter(cluster=cluster, state=Node.State.READY).count() == 3


def test_a_node_whose_node_object_vanished_is_still_replaced(aws, fleet):  # noqa: F811
    """The Node object went (deleted by hand, or the kubelet lost its
    registration) while the instance runs on in the group: the instance must
    still be terminated, or the group never brings up another."""
    cluster, now = fleet["cluster"], fleet["now"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    fleet["world"].core.delete_node(old.name)

    def noted():
        # The deletion reaches the pass through the node informer's watch.
        reconcile_cluster_unlocked(cluster.id, later(now, 1))
        old.refresh_from_db()
        return old.not_ready_since is not None

    eventually(noted, timeout=30, interval=0.2, what="the pass to see the Node gone")
    assert old.state == Node.State.READY  # not ready for a moment is no failure yet
    before = group_instances(aws, fleet["group"])
    assert len(before) == 3 and instance_id(old.provider_id) in before
    grace = cluster.config.node_failure_grace_s

    # Past the grace it fails, with a "lost" event, and with nothing on it
    # the same pass replaces it: the instance terminated, its place taken by
    # the spare, and no spare added for it (the machine the group brings in
    # its stead is the new spare: one failure, one machine).
    reconcile_cluster_unlocked(cluster.id, later(now, 1 + grace))

    assert old.events.filter(to_state="failed").exists()
    assert old.health_events.get(kind="lost").handled_at is not None
    check_replaced(aws, fleet, old, before, later(now, 1 + grace))


def test_a_spot_notice_for_an_idle_node_replaces_it(aws, fleet):  # noqa: F811
    cluster, now, sqs, url = fleet["cluster"], fleet["now"], fleet["sqs"], fleet["spot_url"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(instance_id(old.provider_id)))

    reconcile_cluster_unlocked(cluster.id, later(now, 1))

    (event,) = NodeHealthEvent.objects.filter(node=old)
    assert (event.kind, event.severity) == ("spot_notice", "critical")
    assert event.handled_at is not None
    assert event.evidence["detail"]["instance-action"] == "terminate"
    assert counts(sqs, url) == (0, 0)
    check_replaced(aws, fleet, old, fleet["ids"], later(now, 1))
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 1


def test_an_sns_wrapped_notice_and_the_nth_taint_are_one_interruption(aws, fleet):  # noqa: F811
    """EventBridge -> SNS -> SQS, and Node Termination Handler's taint on the
    same node (TAINT_NODE=true): one health event, one replacement."""
    cluster, now, sqs, url = fleet["cluster"], fleet["now"], fleet["sqs"], fleet["spot_url"]
    old = Node.objects.filter(cluster=cluster, is_spare=False).order_by("name").first()
    iid = instance_id(old.provider_id)
    fleet["world"].fleet.taint(old.name, value="1700000000")
    sqs.send_message(QueueUrl=url, MessageBody=sns_envelope(spot_event(iid)))

    reconcile_cluster_unlocked(cluster.id, later(now, 1))

    (event,) = NodeHealthEvent.objects.filter(node=old)
    assert event.kind == "spot_notice" and event.evidence["key"] == f"spot-interruption/{iid}"
    assert counts(sqs, url) == (0, 0)
    check_replaced(aws, fleet, old, fleet["ids"], later(now, 1))
    assert NodeHealthEvent.objects.filter(node__cluster=cluster).count() == 1


def node_of(cluster, iid):
    return by_instance(cluster)[iid]


def working(cluster):
    return Node.objects.filter(cluster=cluster, is_spare=False).order_by("name")


def test_a_replacement_never_sleeps_and_a_successor_not_launched_yet_joins_later(
        aws, asg, fleet, monkeypatch):  # noqa: F811
    """AWS takes a while to launch the successor (the stand-in holds it back):
    the pass terminates and moves on without sleeping, asks for no extra spare
    while the group is short, and a later pass finds the successor as a spare."""
    cluster, group, now = fleet["cluster"], fleet["group"], fleet["now"]
    slept = []
    monkeypatch.setattr("time.sleep", slept.append)
    old = working(cluster).first()
    Node.objects.filter(pk=old.pk).update(replace_requested_at=now)
    asg.starve(group)

    reconcile_cluster_unlocked(cluster.id, later(now, 1))

    old.refresh_from_db()
    assert old.state == Node.State.REPLACED and slept == []
    assert instance_id(old.provider_id) not in group_instances(aws, group)
    assert desired(aws, group) == 3  # no extra spare asked while the group is short
    assert set(by_instance(cluster)) == set(fleet["ids"])  # nothing new yet

    asg.feed(group)  # the group's instance is up
    reconcile_cluster_unlocked(cluster.id, later(now, 2))
    (fresh,) = set(by_instance(cluster)) - set(fleet["ids"])
    new = node_of(cluster, fresh)
    assert new.is_spare and new.state == Node.State.PROVISIONING
    assert new.events.get(to_state="provisioning").reason == "found at the provider (spare)"
    assert desired(aws, group) == 3 and slept == []


def test_a_failed_launch_is_an_event_a_condition_and_a_backoff(aws, asg, fleet):  # noqa: F811
    cluster, group, now, pool = fleet["cluster"], fleet["group"], fleet["now"], fleet["pool"]
    first, second = working(cluster)
    Node.objects.filter(pk=first.pk).update(replace_requested_at=now)
    asg.starve(group)
    reconcile_cluster_unlocked(cluster.id, later(now, 1))  # terminated; the group cannot launch
    asg.activities[group] = [insufficient_capacity(group)]

    reconcile_cluster_unlocked(cluster.id, later(now, 2))

    (event,) = first.events.filter(reason__startswith="the group could not launch")
    assert "Failed: We currently do not have sufficient p5.48xlarge capacity" in event.reason
    assert event.evidence["status"] == "Failed" and not event.evidence["permanent"]
    pool.refresh_from_db()
    assert pool.scaling_failures == 1 and "sufficient p5.48xlarge" in pool.scaling_error
    cluster.refresh_from_db()
    (condition,) = [c for c in cluster.conditions if c["type"] == "ScalingFailed"]
    assert condition["pool"] == "h100" and condition["count"] == 1
    assert "sufficient p5.48xlarge capacity" in condition["message"]
    assert 0 < condition["retry_after_s"] <= 30

    # Backing off: an operator's replacement is claimed but not asked, and no
    # spare is asked for (the group would fail both).
    Node.objects.filter(pk=second.pk).update(replace_requested_at=later(now, 3))
    reconcile_cluster_unlocked(cluster.id, later(now, 3))
    second.refresh_from_db()
    assert second.state == Node.State.REPLACED and second.replace_requested_at is not None
    assert instance_id(second.provider_id) in group_instances(aws, group)
    assert second.events.filter(reason__startswith="replacement deferred").exists()
    assert desired(aws, group) == 3
    # The same failure read again: counted once.
    reconcile_cluster_unlocked(cluster.id, later(now, 20))
    pool.refresh_from_db()
    assert pool.scaling_failures == 1
    assert instance_id(second.provider_id) in group_instances(aws, group)

    # Past the backoff the owed ask is made; once the group launches, the
    # failures in a row end and the condition goes.
    reconcile_cluster_unlocked(cluster.id, later(now, 33))
    assert instance_id(second.provider_id) not in group_instances(aws, group)
    asg.feed(group)
    asg.activities[group].append(activity(group, "Successful"))
    reconcile_cluster_unlocked(cluster.id, later(now, 34))
    pool.refresh_from_db()
    cluster.refresh_from_db()
    assert pool.scaling_failures == 0 and pool.scaling_watch_since is None
    assert not [c for c in cluster.conditions if c["type"] == "ScalingFailed"]


def test_a_termination_hook_is_completed_for_our_drained_node_only(
        aws, asg, fleet, monkeypatch):  # noqa: F811
    """With a termination lifecycle hook the group holds a terminated instance
    in Terminating:Wait (up to the hook's timeout). Ours is let go once no gang
    is on its node; another controller's is never touched."""
    cluster, group, now = fleet["cluster"], fleet["group"], fleet["now"]
    client("autoscaling", aws).put_lifecycle_hook(
        LifecycleHookName="nth-drain", AutoScalingGroupName=group,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING", HeartbeatTimeout=3600,
        DefaultResult="CONTINUE")
    spare = Node.objects.get(cluster=cluster, is_spare=True)
    theirs = instance_id(spare.provider_id)
    client("autoscaling", asg.url).terminate_instance_in_auto_scaling_group(
        InstanceId=theirs, ShouldDecrementDesiredCapacity=False)  # another controller's
    old = working(cluster).first()
    ours = instance_id(old.provider_id)
    Node.objects.filter(pk=old.pk).update(replace_requested_at=now)
    # The gang on it is still leaving (stopped, pods terminating).
    monkeypatch.setattr(scaling, "jobs_on", lambda ids: {old.id: [7]})

    reconcile_cluster_unlocked(cluster.id, later(now, 1))

    old.refresh_from_db()
    assert old.state == Node.State.REPLACED and old.released_at is None
    assert set(asg.held) == {ours, theirs} and asg.completed == []

    monkeypatch.setattr(scaling, "jobs_on", lambda ids: {})
    reconcile_cluster_unlocked(cluster.id, later(now, 2))

    old.refresh_from_db()
    assert old.released_at == later(now, 2)
    (done,) = asg.completed
    assert (done["InstanceId"], done["LifecycleHookName"], done["AutoScalingGroupName"],
            done["LifecycleActionResult"]) == (ours, "nth-drain", group, "CONTINUE")
    assert old.events.filter(reason__contains=f"lifecycle action of {ours} completed").exists()
    assert set(asg.held) == {theirs}  # not ours to let go

    reconcile_cluster_unlocked(cluster.id, later(now, 3))
    assert len(asg.completed) == 1 and set(asg.held) == {theirs}
