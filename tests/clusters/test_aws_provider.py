"""Node replacement through EC2 Auto Scaling and spot interruption notices.

AWS cannot be reached from here: moto's server on 127.0.0.1 stands in for
it (real HTTP, real boto3), and tests/support/k8s_standin.py stands in for
the Kubernetes API server where the two meet.
"""

import json
import uuid

import pytest

from clusters.providers.aws import SPOT_WARNING, AwsProvider, instance_id
from clusters.providers.kubernetes import KubernetesProvider, KubeSettings
from controlplane.lib.errors import PermanentError
from tests.clusters.test_kubernetes_manifests import make_pool
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


@pytest.fixture
def group():
    return unique("h100-nodes")


def asg_pool(group, **settings):
    return make_pool(settings={"asg_name": group, "replace_timeout_s": 5,
                               "replace_poll_s": 0.1, **settings})


@pytest.fixture
def provider(aws):  # noqa: F811
    return AwsProvider.for_settings({"region": REGION, "endpoint_url": aws})


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


def test_it_replaces_a_failed_node_without_shrinking_the_group(aws, provider, group):  # noqa: F811
    before = make_group(aws, group)
    failed = before[0]
    node = provider.replace(asg_pool(group), f"aws:///{REGION}a/{failed}")

    after = group_instances(aws, group)
    assert failed not in after and len(after) == 2 and desired(aws, group) == 2
    new = instance_id(node.provider_id)
    assert new in after and new not in before
    assert node.provider_id == f"aws:///{REGION}a/{new}"
    assert node.name.startswith("ip-") and node.name.endswith(".ec2.internal")
    assert node.address and node.gpus == 8
    assert node.ready is False  # ready once it joins the cluster
    assert node.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    state = client("ec2", aws).describe_instances(InstanceIds=[failed])[
        "Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")


def test_replacing_again_terminates_nothing_more(aws, provider, group):  # noqa: F811
    failed = make_group(aws, group)[0]
    provider.replace(asg_pool(group), f"aws:///{REGION}a/{failed}")
    members = group_instances(aws, group)
    assert provider.replace(asg_pool(group), f"aws:///{REGION}a/{failed}") is None
    assert group_instances(aws, group) == members


def test_it_waits_for_the_new_instance_only_as_long_as_allowed(aws, group):  # noqa: F811
    """moto replaces at once; here the group is asked for nothing new, so the
    wait has nothing to find and must give up at its deadline."""
    ids = make_group(aws, group)
    ticks = iter(range(0, 100))
    slept = []
    provider = AwsProvider.for_settings({"region": REGION, "endpoint_url": aws})
    provider._clock, provider._sleep = (lambda: next(ticks)), slept.append
    provider._live_ids = lambda group: set(ids) - {ids[0]} if slept else set(ids)
    assert provider.replace(asg_pool(group, replace_timeout_s=3), f"aws:///x/{ids[0]}") is None
    assert slept == [0.1, 0.1]  # polled at t=1 and t=2, gave up at the deadline t=3


def test_it_lists_the_groups_instances_as_nodes(aws, provider, group):  # noqa: F811
    ids = make_group(aws, group, size=3)
    nodes = provider.list_nodes(asg_pool(group))
    assert sorted(instance_id(n.provider_id) for n in nodes) == ids


def test_it_adds_a_spare_by_raising_the_desired_capacity(aws, provider, group):  # noqa: F811
    ids = make_group(aws, group, size=2, max_size=3)
    node = provider.provision(asg_pool(group))
    assert desired(aws, group) == 3
    assert instance_id(node.provider_id) not in ids
    with pytest.raises(PermanentError, match="MaxSize"):
        provider.provision(asg_pool(group))
    assert desired(aws, group) == 3


@pytest.mark.parametrize("bad", ["", "aws:///us-east-1a/", "gce://project/zone/vm-1"])
def test_a_provider_id_that_names_no_instance_is_refused(bad):
    with pytest.raises(PermanentError):
        instance_id(bad)


def test_an_unknown_group_or_missing_settings_are_permanent(aws, provider, group):  # noqa: F811
    with pytest.raises(PermanentError, match="does not exist"):
        provider.replace(asg_pool(group), "aws:///us-east-1a/i-0123")
    with pytest.raises(PermanentError, match="asg_name"):
        provider.replace(make_pool(), "aws:///us-east-1a/i-0123")
    with pytest.raises(PermanentError, match="region"):
        AwsProvider.for_settings({})


def test_it_turns_a_spot_interruption_warning_into_a_signal(aws, provider, group):  # noqa: F811
    ids = make_group(aws, group)
    sqs = client("sqs", aws)
    url = sqs.create_queue(QueueName=unique("spot-notices"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[0]))
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[1], "EC2 Instance Rebalance "
                                                                  "Recommendation"))
    sqs.send_message(QueueUrl=url, MessageBody=spot_event("i-0fromanotherpool"))
    sqs.send_message(QueueUrl=url, MessageBody="not json")

    signals = provider.spot_signals(asg_pool(group, spot_queue_url=url))
    by_node = {s.evidence["provider_id"].rsplit("/", 1)[-1]: s for s in signals}
    assert set(by_node) == set(ids)
    warning, rebalance = by_node[ids[0]], by_node[ids[1]]
    assert (warning.kind, warning.severity) == ("spot_notice", "critical")
    assert (rebalance.kind, rebalance.severity) == ("spot_notice", "warning")
    assert warning.node.startswith("ip-")
    assert warning.evidence["detail"]["instance-action"] == "terminate"
    assert warning.key.startswith("aws-event/")
    # Ours and the junk are consumed; another pool's notice goes back to the queue.
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert [json.loads(m["Body"])["detail"]["instance-id"] for m in left] == [
        "i-0fromanotherpool"]


def test_a_pool_without_a_queue_has_no_spot_signals(aws, provider, group):  # noqa: F811
    assert provider.spot_signals(make_pool()) == []


# --- where Kubernetes meets AWS ----------------------------------------------------

def test_kubernetes_replaces_through_the_group_when_the_pool_has_one(aws, group):  # noqa: F811
    failed = make_group(aws, group)[0]
    with st.K8sStandIn() as standin:
        standin.put(st.NODES, st.node("ip-10-0-0-9.ec2.internal", instance=failed))
        provider = KubernetesProvider(
            standin.api_client(), KubeSettings(),
            aws_factory=lambda: AwsProvider.for_settings({"region": REGION,
                                                          "endpoint_url": aws}))
        node = provider.replace(asg_pool(group), "ip-10-0-0-9.ec2.internal")
        assert instance_id(node.provider_id) in group_instances(aws, group)
        assert failed not in group_instances(aws, group)
        # The cloud removes the Node object once the instance is gone, not Regatta.
        assert standin.calls("DELETE") == []


def test_kubernetes_health_includes_spot_notices_from_the_queue(aws, group):  # noqa: F811
    ids = make_group(aws, group)
    sqs = client("sqs", aws)
    url = sqs.create_queue(QueueName=unique("spot"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=spot_event(ids[1]))
    with st.K8sStandIn() as standin:
        standin.put(st.NODES, st.node("n1", labels={"eks.amazonaws.com/nodegroup": "h100"}))
        provider = KubernetesProvider(
            standin.api_client(), KubeSettings(),
            aws_factory=lambda: AwsProvider.for_settings({"region": REGION,
                                                          "endpoint_url": aws}))
        (signal,) = provider.health_signals(asg_pool(group, spot_queue_url=url))
        assert signal.kind == "spot_notice" and ids[1] in signal.evidence["provider_id"]
