"""Node replacement through EC2 Auto Scaling and spot interruption notices.

AWS cannot be reached from here: moto's server on 127.0.0.1 stands in for
it (real HTTP, real boto3). Where it meets Kubernetes, the API server is the
real test cluster's (tests/support/kube_cluster.py), with kwok nodes
registered as the group's instances.
"""

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client as k8s

from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from clusters.providers.kubernetes.aws_node_groups import SPOT_WARNING, AwsNodeGroups, instance_id
from controlplane.lib.errors import PermanentError
from testcluster import bootstrap
from testcluster.fleet import Pool
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

from .test_manifests import make_pool


@pytest.fixture
def group():
    return unique("h100-nodes")


def asg_pool(group, **settings):
    return make_pool(settings={"asg_name": group, **settings})


def node_groups_at(url):
    return AwsNodeGroups.for_settings(KubeSettings.parse({"region": REGION, "endpoint_url": url}))


@pytest.fixture
def node_groups(aws):  # noqa: F811
    return node_groups_at(aws)


def desired(url, group):
    return client("autoscaling", url).describe_auto_scaling_groups(
        AutoScalingGroupNames=[group])["AutoScalingGroups"][0]["DesiredCapacity"]


def spot_event(instance, kind=SPOT_WARNING):
    return json.dumps({
        "version": "0", "id": str(uuid.uuid4()), "detail-type": kind, "source": "aws.ec2",
        "account": "123456789012", "time": "2026-01-05T10:00:00Z", "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance}"],
        "detail": {"instance-id": instance, "instance-action": "terminate"}
        if kind == SPOT_WARNING else {"instance-id": instance},
    })


def test_it_replaces_a_failed_node_without_shrinking_the_group_or_waiting(
        aws, node_groups, group, monkeypatch):  # noqa: F811
    """The call terminates, reads the group once more and returns: no sleep.
    moto launches the successor at once, so that one read finds it (AWS takes
    longer: then None, and a later listing finds it)."""
    before = make_group(aws, group)
    failed = before[0]
    slept, calls = [], []
    monkeypatch.setattr(time, "sleep", slept.append)
    node_groups.autoscaling.meta.events.register(
        "before-call", lambda model, **kw: calls.append(model.name))

    node = node_groups.replace(asg_pool(group), f"aws:///{REGION}a/{failed}")

    assert slept == [] and calls == ["DescribeAutoScalingGroups",
                                     "TerminateInstanceInAutoScalingGroup",
                                     "DescribeAutoScalingGroups"]
    after = group_instances(aws, group)
    assert failed not in after and len(after) == 2 and desired(aws, group) == 2
    (new,) = set(after) - set(before)
    assert instance_id(node.provider_id) == new
    assert node.provider_id == f"aws:///{REGION}a/{new}"
    assert node.name.startswith("ip-") and node.name.endswith(".ec2.internal")
    assert node.address and node.gpus == 8
    assert node.ready is False  # ready once it joins the cluster
    assert node.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    state = client("ec2", aws).describe_instances(InstanceIds=[failed])[
        "Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")


def test_replacing_again_terminates_nothing_more(aws, node_groups, group):  # noqa: F811
    failed = make_group(aws, group)[0]
    node_groups.replace(asg_pool(group), f"aws:///{REGION}a/{failed}")
    members = group_instances(aws, group)
    assert node_groups.replace(asg_pool(group), f"aws:///{REGION}a/{failed}") is None
    assert group_instances(aws, group) == members


def test_the_old_wait_settings_still_load_and_change_nothing(aws, node_groups, group):  # noqa: F811
    """Pools saved with `replace_timeout_s`/`replace_poll_s` keep loading."""
    ids = make_group(aws, group)
    pool = asg_pool(group, replace_timeout_s=300, replace_poll_s=5)
    assert node_groups.replace(pool, f"aws:///{REGION}a/{ids[0]}") is not None


def test_it_lists_the_groups_instances_as_nodes(aws, node_groups, group):  # noqa: F811
    ids = make_group(aws, group, size=3)
    nodes = node_groups.list_nodes(asg_pool(group))
    assert sorted(instance_id(n.provider_id) for n in nodes) == ids


def test_it_adds_a_spare_by_raising_the_desired_capacity(aws, node_groups, group):  # noqa: F811
    ids = make_group(aws, group, size=2, max_size=3)
    node = node_groups.provision(asg_pool(group))
    assert desired(aws, group) == 3
    assert instance_id(node.provider_id) not in ids
    with pytest.raises(PermanentError, match="MaxSize"):
        node_groups.provision(asg_pool(group))
    assert desired(aws, group) == 3


@pytest.mark.parametrize("bad", ["", "aws:///us-east-1a/", "gce://project/zone/vm-1"])
def test_a_provider_id_that_names_no_instance_is_refused(bad):
    with pytest.raises(PermanentError):
        instance_id(bad)


def test_an_unknown_group_or_missing_settings_are_permanent(aws, node_groups, group):  # noqa: F811
    with pytest.raises(PermanentError, match="does not exist"):
        node_groups.replace(asg_pool(group), "aws:///us-east-1a/i-0123")
    with pytest.raises(PermanentError, match="asg_name"):
        node_groups.replace(make_pool(), "aws:///us-east-1a/i-0123")
    with pytest.raises(PermanentError, match="region"):
        AwsNodeGroups.for_settings(KubeSettings.parse({}))


def queue(url):
    sqs = client("sqs", url)
    return sqs, sqs.create_queue(QueueName=unique("spot-notices"))["QueueUrl"]


def counts(sqs, url):
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]))


def test_it_turns_a_spot_interruption_warning_into_a_signal(aws, node_groups, group):  # noqa: F811
    ids = make_group(aws, group)
    sqs, url = queue(aws)
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[0]))
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[1], "EC2 Instance Rebalance "
                                                                  "Recommendation"))
    sqs.send_message(QueueUrl=url, MessageBody="not json")

    signals = node_groups.spot_signals(asg_pool(group, spot_queue_url=url))
    by_node = {s.evidence["provider_id"].rsplit("/", 1)[-1]: s for s in signals}
    assert set(by_node) == set(ids)
    warning, rebalance = by_node[ids[0]], by_node[ids[1]]
    assert (warning.kind, warning.severity) == ("spot_notice", "critical")
    assert (rebalance.kind, rebalance.severity) == ("spot_notice", "warning")
    assert warning.node.startswith("ip-")
    assert warning.evidence["detail"]["instance-action"] == "terminate"
    assert warning.key == f"spot-interruption/{ids[0]}"  # the NTH taint's key too
    assert counts(sqs, url) == (0, 0)  # handled, and the junk, are deleted


def test_a_notice_for_an_instance_gone_or_terminating_is_deleted(aws, node_groups, group):  # noqa: F811
    ids = make_group(aws, group, size=3)
    client("autoscaling", aws).terminate_instance_in_auto_scaling_group(
        InstanceId=ids[0], ShouldDecrementDesiredCapacity=False)
    client("ec2", aws).terminate_instances(InstanceIds=[ids[1]])
    sqs, url = queue(aws)
    for instance in (ids[0], ids[1], "i-0000000000000dead"):
        sqs.send_message(QueueUrl=url, MessageBody=spot_event(instance))

    assert node_groups.spot_signals(asg_pool(group, spot_queue_url=url)) == []
    # Nobody can act on them any more: none is left to come back forever.
    assert counts(sqs, url) == (0, 0)


def test_another_clusters_notice_is_left_for_it_and_received_once_a_sweep(aws, group):  # noqa: F811
    ours = make_group(aws, group)
    their_group = unique("a100-nodes")
    theirs = make_group(aws, their_group)
    sqs, url = queue(aws)
    for _ in range(12):  # more than one batch, so the sweep receives again
        sqs.send_message(QueueUrl=url, MessageBody=spot_event(theirs[0]))
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ours[0]))
    node_groups = node_groups_at(aws)
    received = []
    real = node_groups.sqs.receive_message

    def spy(**kw):
        answer = real(**kw)
        received.extend(m["MessageId"] for m in answer.get("Messages", []))
        return answer

    node_groups.sqs.receive_message = spy
    (signal,) = node_groups.spot_signals(asg_pool(group, spot_queue_url=url,
                                               spot_foreign_visibility_s=2))
    assert ours[0] in signal.evidence["provider_id"]
    # Every message seen once in the sweep, then hidden for a while rather than
    # handed straight back to be received again.
    assert len(received) == 13 and len(set(received)) == 13
    assert counts(sqs, url) == (0, 12)

    # Once their visibility timeout ends, the 12 are the owner's to receive.
    eventually(lambda: counts(sqs, url) == (12, 0), what="the notices visible again")
    owner = node_groups_at(aws)
    signals = owner.spot_signals(asg_pool(their_group, spot_queue_url=url))
    assert len(signals) == 12
    assert {s.evidence["provider_id"].rsplit("/", 1)[-1] for s in signals} == {theirs[0]}
    assert counts(sqs, url) == (0, 0)


def test_a_pool_without_a_queue_has_no_spot_signals(aws, node_groups, group):  # noqa: F811
    assert node_groups.spot_signals(make_pool()) == []


# --- where Kubernetes meets AWS: the real test cluster -------------------------------

def kube_with_aws(world, url):
    """The provider as the control plane runs it: deploy/'s ServiceAccount
    token on the test cluster, AWS at moto's server."""
    return KubernetesProvider(
        bootstrap.api_client(world.regatta_kubeconfig), KubeSettings(request_timeout_s=10),
        aws_factory=lambda: node_groups_at(url))


def group_nodes(group):
    """The kwok nodes of a node group named as the test's Auto Scaling group."""
    return Pool(name=group, size=0)


def kube_pool(group, **settings):
    return make_pool(node_selector=group_nodes(group).selector,
                     settings={"asg_name": group, **settings})


def register(world, group, name, instance):
    world.made_nodes.append(world.fleet.register(group_nodes(group), name,
                                                 f"aws:///us-east-1a/{instance}"))
    eventually(lambda: world.fleet.ready(name), timeout=30, interval=0.1,
               what=f"kwok to make {name} ready")


def node_gone(world, name) -> bool:
    try:
        world.core.read_node(name)
    except k8s.ApiException as exc:
        return exc.status == 404
    return False


def private_dns(url, instance):
    return client("ec2", url).describe_instances(InstanceIds=[instance])[
        "Reservations"][0]["Instances"][0]["PrivateDnsName"]


@pytest.mark.slow
def test_kubernetes_replaces_through_the_group_then_deletes_the_node(
        aws, group, kube_world):  # noqa: F811
    """An EKS managed node group's kubelet re-registers a deleted Node: the
    instance goes through the group (terminated, the group's successor
    launched), and the Node object is deleted."""
    failed = make_group(aws, group)[0]
    name = private_dns(aws, failed)
    register(kube_world, group, name, failed)
    provider = kube_with_aws(kube_world, aws)

    node = provider.replace(kube_pool(group), name)

    assert instance_id(node.provider_id) in group_instances(aws, group)
    assert failed not in group_instances(aws, group) and desired(aws, group) == 2
    assert node_gone(kube_world, name)
    members = group_instances(aws, group)
    assert provider.replace(kube_pool(group), name) is None
    assert group_instances(aws, group) == members  # a repeat terminates nothing more


@pytest.mark.slow
def test_kubernetes_replaces_an_instance_whose_node_object_is_gone(
        aws, group, kube_world):  # noqa: F811
    """The Node object vanished (deleted, or never registered) while its
    instance stays in the group: found by the node's name, it is terminated
    all the same, so the group brings up another; the Node's 404s (read,
    then the delete that would clear one left behind) are no error."""
    ids = make_group(aws, group)
    lost = private_dns(aws, ids[0])
    provider = kube_with_aws(kube_world, aws)

    node = provider.replace(kube_pool(group), lost)

    assert node is not None and instance_id(node.provider_id) not in ids
    after = group_instances(aws, group)
    assert ids[0] not in after and ids[1] in after and len(after) == 2
    assert node_gone(kube_world, lost)


@pytest.mark.slow
def test_an_instance_not_yet_registered_is_listed_not_ready(aws, group, kube_world):  # noqa: F811
    """A spare or replacement still booting is the pool's: listed, so the
    reconciler keeps its row, but not ready until its Node registers."""
    ids = make_group(aws, group)
    register(kube_world, group, private_dns(aws, ids[0]), ids[0])

    nodes = {n.name: n for n in kube_with_aws(kube_world, aws).list_nodes(kube_pool(group))}

    assert set(nodes) == {private_dns(aws, i) for i in ids}
    assert nodes[private_dns(aws, ids[0])].ready is True
    booting = nodes[private_dns(aws, ids[1])]
    assert booting.ready is False and instance_id(booting.provider_id) == ids[1]


@pytest.mark.slow
def test_kubernetes_health_includes_spot_notices_from_the_queue(
        aws, group, kube_world):  # noqa: F811
    ids = make_group(aws, group)
    sqs = client("sqs", aws)
    url = sqs.create_queue(QueueName=unique("spot"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[1]))
    register(kube_world, group, private_dns(aws, ids[0]), ids[0])
    provider = kube_with_aws(kube_world, aws)

    signals = provider.health_signals(kube_pool(group, spot_queue_url=url))

    (signal,) = [s for s in signals if s.kind == "spot_notice"]
    assert ids[1] in signal.evidence["provider_id"]


def sns_envelope(event: str) -> str:
    """What SQS holds when EventBridge publishes to SNS and SNS to SQS
    without raw message delivery: the event as a string in SNS's envelope."""
    return json.dumps({
        "Type": "Notification", "MessageId": str(uuid.uuid4()),
        "TopicArn": f"arn:aws:sns:{REGION}:123456789012:spot-notices",
        "Message": event, "Timestamp": "2026-01-05T10:00:01.000Z",
        "SignatureVersion": "1", "Signature": "c2lnbmF0dXJl",
        "SigningCertURL": "https://sns.example/cert.pem",
        "UnsubscribeURL": "https://sns.example/unsubscribe"})


def test_a_notice_in_an_sns_envelope_is_read_not_deleted_unread(aws, node_groups, group):  # noqa: F811
    ids = make_group(aws, group)
    sqs, url = queue(aws)
    sqs.send_message(QueueUrl=url, MessageBody=sns_envelope(spot_event(ids[0])))
    sqs.send_message(QueueUrl=url, MessageBody=sns_envelope("not json"))

    (signal,) = node_groups.spot_signals(asg_pool(group, spot_queue_url=url))

    assert (signal.kind, signal.severity) == ("spot_notice", "critical")
    assert signal.evidence["detail"]["instance-id"] == ids[0]
    assert signal.key == f"spot-interruption/{ids[0]}"
    assert counts(sqs, url) == (0, 0)


def test_another_clusters_notice_in_an_sns_envelope_is_left_for_it(aws, node_groups, group):  # noqa: F811
    make_group(aws, group)
    other = make_group(aws, unique("other"))
    sqs, url = queue(aws)
    sqs.send_message(QueueUrl=url, MessageBody=sns_envelope(spot_event(other[0])))
    assert node_groups.spot_signals(asg_pool(group, spot_queue_url=url)) == []
    assert counts(sqs, url) == (0, 1)  # hidden for its owner, not deleted


def count_calls(node_groups) -> list[str]:
    """Every AWS request the node groups' clients send, by operation."""
    calls = []
    for name in ("autoscaling", "ec2", "sqs"):
        getattr(node_groups, name).meta.events.register(
            "before-call", lambda model, **kw: calls.append(model.name))
    return calls


def test_our_notice_behind_150_of_other_clusters_is_a_signal_on_the_first_sweep(aws, group):  # noqa: F811
    """A queue shared with other clusters: 150 notices for another group's
    live instances sent before ours. The first sweep finds ours, in 36 AWS
    calls (it took two sweeps, 121 + 65 calls, when a sweep read ten batches
    and hid each foreign notice with a call of its own: docs/performance.md)."""
    ours = make_group(aws, group)
    theirs = make_group(aws, unique("a100-nodes"), size=3)
    sqs, url = queue(aws)
    for i in range(150):
        sqs.send_message(QueueUrl=url, MessageBody=spot_event(theirs[i % 3]))
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ours[1]))
    node_groups = node_groups_at(aws)
    calls = count_calls(node_groups)

    (signal,) = node_groups.spot_signals(asg_pool(group, spot_queue_url=url))

    assert signal.evidence["detail"]["instance-id"] == ours[1]
    # 17 receives (16 with messages, one empty), one group, one describe for
    # theirs and one for ours, 15 visibility batches, one delete batch.
    assert calls.count("ReceiveMessage") == 17
    assert calls.count("ChangeMessageVisibilityBatch") == 15
    assert calls.count("DeleteMessageBatch") == 1
    assert calls.count("DescribeInstances") == 2
    assert calls.count("DescribeAutoScalingGroups") == 1
    assert len(calls) == 36
    assert counts(sqs, url) == (0, 150)  # theirs left, hidden, for their owner


# --- what the group did with our asks (tests/support/asg_standin.py serves
# the scaling activities, lifecycle hooks and the group that cannot launch) ---

@pytest.fixture
def asg(aws):  # noqa: F811
    with AsgStandIn(aws) as proxy:
        yield proxy


def through(asg):
    return node_groups_at(asg.url)


def test_scaling_status_reports_failed_launches_since_the_ask(aws, asg, group):  # noqa: F811
    make_group(aws, group)
    asked = datetime.now(UTC)
    asg.activities[group] = [
        insufficient_capacity(group, at=asked - timedelta(hours=1)),  # before our ask
        insufficient_capacity(group, at=asked + timedelta(seconds=5)),
        activity(group, "Cancelled", "The launch template lt-0abc does not exist. "
                 "Launching EC2 instance failed.", at=asked + timedelta(seconds=9)),
    ]
    asg.starve(group)
    client("autoscaling", aws).set_desired_capacity(AutoScalingGroupName=group,
                                                    DesiredCapacity=3)

    status = through(asg).scaling_status(asg_pool(group), asked)

    assert not status.settled  # two of three instances: the group is short
    capacity, template = status.failures
    assert capacity.status == "Failed" and not capacity.permanent
    assert "sufficient p5.48xlarge capacity" in capacity.message
    assert template.status == "Cancelled" and template.permanent
    asg.feed(group)
    asg.activities[group].append(activity(group, "Successful", at=asked + timedelta(seconds=30)))
    assert through(asg).scaling_status(asg_pool(group), asked).settled


def test_provision_asks_no_more_while_the_group_is_short(aws, asg, group):  # noqa: F811
    make_group(aws, group, size=2, max_size=6)
    node_groups = through(asg)
    assert node_groups.provision(asg_pool(group)) is not None and desired(aws, group) == 3
    asg.starve(group)
    client("autoscaling", aws).set_desired_capacity(AutoScalingGroupName=group,
                                                    DesiredCapacity=4)
    assert node_groups.provision(asg_pool(group)) is None
    assert desired(aws, group) == 4  # not 5: the group has yet to launch the last ask


def test_release_completes_the_termination_hook_of_our_instance(aws, asg, group):  # noqa: F811
    ids = make_group(aws, group)
    node_groups = through(asg)
    assert node_groups.release(asg_pool(group), f"aws:///{REGION}a/{ids[0]}") == ""  # no hook
    client("autoscaling", aws).put_lifecycle_hook(
        LifecycleHookName="drain", AutoScalingGroupName=group,
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING")
    node_groups.replace(asg_pool(group), f"aws:///{REGION}a/{ids[0]}")
    assert ids[0] in asg.held  # Terminating:Wait

    done = node_groups.release(asg_pool(group), f"aws:///{REGION}a/{ids[0]}")

    assert "completed" in done and ids[0] not in asg.held
    assert [(c["InstanceId"], c["LifecycleActionResult"]) for c in asg.completed] == [
        (ids[0], "CONTINUE")]
    # Gone from the group now: nothing holds it, nothing is called.
    assert node_groups.release(asg_pool(group), f"aws:///{REGION}a/{ids[0]}") == ""
    assert len(asg.completed) == 1


def test_a_lifecycle_action_completed_by_someone_else_is_not_an_error(aws, asg, group):  # noqa: F811
    make_group(aws, group)
    asg.held["i-0123456789abcdef0"] = "elsewhere"  # held by another group: AWS says no
    through(asg)._complete(group, "drain", "i-0123456789abcdef0")
    assert asg.completed == []
