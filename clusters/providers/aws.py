"""EC2 Auto Scaling behind node pools, and spot interruption notices.

A pool whose settings name an Auto Scaling group (`asg_name`) gets its nodes
replaced through the group: the failed instance is terminated without
lowering the desired capacity, so the group launches a new one, which this
adapter waits for (bounded) and returns as a spare. Spot interruption
warnings arrive as EventBridge events in an SQS queue (`spot_queue_url`)
and become spot-notice health signals. Settings: docs/aws.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from controlplane.lib.errors import PermanentError, TemporaryError

from .base import HealthSignal, NodeInfo, PoolInfo, interruption_key

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
_TEMPORARY_CODES = {
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable",
    "InternalFailure", "InternalError", "RequestTimeout", "ScalingActivityInProgress",
    "ResourceContention",
}
_PERMANENT_CODES = {
    "ValidationError", "AccessDenied", "AccessDeniedException", "UnauthorizedOperation",
    "InvalidClientTokenId", "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist", "InvalidParameterValue",
}


@contextlib.contextmanager
def classified(what: str) -> Iterator[None]:
    """AWS errors in the reconcilers' three classes."""
    from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError

    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        message = f"{what}: {code} {error.get('Message', '')}".strip()
        if code in _TEMPORARY_CODES or status == 429 or status >= 500:
            raise TemporaryError(message, delay=5.0) from exc
        if code in _PERMANENT_CODES or status in (400, 403):
            raise PermanentError(message) from exc
        raise
    except (ConnectionError, HTTPClientError) as exc:
        raise TemporaryError(f"{what}: {exc}", delay=5.0) from exc
    except BotoCoreError:
        raise


def instance_id(provider_id: str) -> str:
    """`aws:///us-east-1a/i-0abc` (a Kubernetes node's providerID) → `i-0abc`."""
    tail = provider_id.rstrip("/").rsplit("/", 1)[-1]
    if not tail.startswith("i-"):
        raise PermanentError(f"{provider_id!r} does not name an EC2 instance")
    return tail


class AwsProvider:
    """The AWS side of a cluster: Auto Scaling groups and spot notices."""

    kind = "aws"

    def __init__(self, session: Any, endpoint_url: str | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
        self.autoscaling = session.client("autoscaling", **kwargs)
        self.ec2 = session.client("ec2", **kwargs)
        self.sqs = session.client("sqs", **kwargs)
        self._sleep, self._clock = sleep, clock

    @classmethod
    def for_settings(cls, settings) -> AwsProvider:
        """From a cluster's KubeSettings: `region`, optional `endpoint_url`,
        `aws_profile`."""
        import boto3

        if not settings.region:
            raise PermanentError("cluster setting 'region' is needed for AWS-backed pools")
        session = boto3.session.Session(region_name=settings.region,
                                        profile_name=settings.aws_profile or None)
        return cls(session, endpoint_url=settings.endpoint_url or None)

    # --- the group ------------------------------------------------------------
    @staticmethod
    def asg_name(pool: PoolInfo) -> str:
        name = pool.settings.asg_name
        if not name:
            raise PermanentError(f"pool {pool.name} has no 'asg_name' setting")
        return name

    def _group(self, pool: PoolInfo) -> dict:
        name = self.asg_name(pool)
        with classified(f"describe Auto Scaling group {name}"):
            groups = self.autoscaling.describe_auto_scaling_groups(
                AutoScalingGroupNames=[name])["AutoScalingGroups"]
        if not groups:
            raise PermanentError(f"Auto Scaling group {name} does not exist")
        return groups[0]

    def _live_ids(self, group: dict) -> set[str]:
        return {i["InstanceId"] for i in group.get("Instances", [])
                if not i.get("LifecycleState", "").startswith("Terminat")}

    def list_nodes(self, pool: PoolInfo) -> list[NodeInfo]:
        group = self._group(pool)
        return self._describe(pool, sorted(self._live_ids(group)))

    def _describe(self, pool: PoolInfo, ids: list[str]) -> list[NodeInfo]:
        if not ids:
            return []
        with classified("describe instances"):
            pages = self.ec2.get_paginator("describe_instances").paginate(InstanceIds=ids)
            instances = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return [self._node(pool, i) for i in sorted(instances, key=lambda i: i["InstanceId"])]

    @staticmethod
    def _node(pool: PoolInfo, inst: dict) -> NodeInfo:
        zone = inst.get("Placement", {}).get("AvailabilityZone", "")
        running = inst.get("State", {}).get("Name") == "running"
        return NodeInfo(
            # EKS names a node after its private DNS name.
            name=inst.get("PrivateDnsName") or inst["InstanceId"],
            provider_id=f"aws:///{zone}/{inst['InstanceId']}",
            address=inst.get("PrivateIpAddress", ""),
            gpus=pool.gpus_per_node,
            # Ready only once it has joined the cluster; the Kubernetes side says so.
            ready=False,
            labels={"node.kubernetes.io/instance-type": inst.get("InstanceType", ""),
                    "topology.kubernetes.io/zone": zone},
            conditions={"InstanceState": inst.get("State", {}).get("Name", "unknown"),
                        "Running": str(running)},
        )

    def provider_id_for(self, pool: PoolInfo, node: str) -> str:
        """The provider id of the group's live instance behind a node name ("" if
        none): EKS names a node after the private DNS name, or after the
        instance id (`i-0abc.us-east-1.compute.internal`) with resource-based
        hostnames. For when the Kubernetes Node, and its providerID, are gone."""
        head = node.split(".", 1)[0]
        for seen in self.list_nodes(pool):
            if seen.name == node or instance_id(seen.provider_id) == head:
                return seen.provider_id
        return ""

    def replace(self, pool: PoolInfo, provider_id: str) -> NodeInfo | None:
        """Terminate the instance without lowering desired capacity and wait,
        bounded by `replace_timeout_s`, for the group's new instance. Calling
        it again for an instance already gone terminates nothing more."""
        old = instance_id(provider_id)
        group = self._group(pool)
        before = self._live_ids(group)
        if old in before:
            with classified(f"terminate {old}"):
                self.autoscaling.terminate_instance_in_auto_scaling_group(
                    InstanceId=old, ShouldDecrementDesiredCapacity=False)
        else:
            return None
        deadline = self._clock() + pool.settings.replace_timeout_s
        poll = pool.settings.replace_poll_s
        while True:
            fresh = sorted(self._live_ids(self._group(pool)) - before - {old})
            if fresh:
                return self._describe(pool, fresh[:1])[0]
            if self._clock() >= deadline:
                # The group keeps working on it; the node shows up in a later listing.
                return None
            self._sleep(poll)

    def provision(self, pool: PoolInfo) -> NodeInfo | None:
        """One more instance for the pool's spares (desired capacity + 1)."""
        group = self._group(pool)
        desired, ceiling = group["DesiredCapacity"], group["MaxSize"]
        if desired >= ceiling:
            raise PermanentError(
                f"Auto Scaling group {group['AutoScalingGroupName']} is at its MaxSize {ceiling}")
        before = self._live_ids(group)
        with classified("set desired capacity"):
            self.autoscaling.set_desired_capacity(
                AutoScalingGroupName=group["AutoScalingGroupName"], DesiredCapacity=desired + 1,
                HonorCooldown=False)
        fresh = sorted(self._live_ids(self._group(pool)) - before)
        return self._describe(pool, fresh[:1])[0] if fresh else None

    # --- spot notices ------------------------------------------------------------
    def spot_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        """Interruption warnings for this pool's instances, read from the SQS
        queue an EventBridge rule feeds, in batches until the queue has nothing
        more to show (at most `spot_max_batches`).

        A notice is deleted once turned into a signal (its key makes a repeat
        harmless), and so is one whose instance is gone or terminating (nobody
        can act on it any more) and anything that is not such a notice. A
        notice for a live instance of another pool or cluster sharing the queue
        is left for its owner, hidden for `spot_foreign_visibility_s` so this
        sweep does not receive it again and the owner's next sweep does."""
        url = pool.settings.spot_queue_url
        if not url:
            return []
        hide = pool.settings.spot_foreign_visibility_s
        batches = pool.settings.spot_max_batches
        signals: list[HealthSignal] = []
        seen: set[str] = set()
        group = None
        for _ in range(batches):
            with classified("receive spot notices"):
                messages = self.sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                    VisibilityTimeout=max(30, hide)).get("Messages", [])
            fresh = [m for m in messages if m["MessageId"] not in seen]
            if not fresh:
                break
            seen.update(m["MessageId"] for m in fresh)
            group = group or self._group(pool)
            signals.extend(self._sort_notices(pool, url, group, fresh, hide))
        return signals

    def _sort_notices(self, pool: PoolInfo, url: str, group: dict, messages: list[dict],
                      hide: int) -> list[HealthSignal]:
        ours = self._live_ids(group)
        events, others, done = [], [], []
        for msg in messages:
            event = _event(msg.get("Body", ""))
            if event is None:
                done.append(msg)
            elif event["detail"]["instance-id"] in ours:
                events.append((msg, event))
            else:
                others.append((msg, event["detail"]["instance-id"]))
        gone = self._gone({iid for _, iid in others}, group)
        nodes = {instance_id(n.provider_id): n for n in
                 self._describe(pool, sorted({e["detail"]["instance-id"] for _, e in events}))}
        signals = [_signal(event, nodes[event["detail"]["instance-id"]])
                   for _, event in events if event["detail"]["instance-id"] in nodes]
        done += [m for m, _ in events] + [m for m, iid in others if iid in gone]
        with classified("acknowledge spot notices"):
            for msg, iid in others:
                if iid not in gone:
                    self.sqs.change_message_visibility(
                        QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"], VisibilityTimeout=hide)
            if done:
                self.sqs.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(done)])
        return signals

    def _gone(self, ids: set[str], group: dict) -> set[str]:
        """Of `ids`, the instances that no longer run or are on their way out:
        terminating in this group, shutting down or terminated, or unknown to
        EC2 (terminated ones drop out of its answers after about an hour)."""
        if not ids:
            return set()
        leaving = {i["InstanceId"] for i in group.get("Instances", [])
                   if i.get("LifecycleState", "").startswith("Terminat")}
        with classified("describe instances"):
            # A filter, not InstanceIds: one unknown id must not fail the rest.
            pages = self.ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": sorted(ids)}])
            states = {i["InstanceId"]: i.get("State", {}).get("Name", "")
                      for page in pages for r in page["Reservations"] for i in r["Instances"]}
        return {i for i in ids if i in leaving or i not in states
                or states[i] in ("shutting-down", "terminated")}


def _event(body: str) -> dict | None:
    try:
        event = json.loads(body)
        if isinstance(event, dict) and event.get("Type") == "Notification" and isinstance(
                event.get("Message"), str):
            # EventBridge -> SNS -> SQS without raw message delivery: the
            # event is the string in SNS's envelope.
            event = json.loads(event["Message"])
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("detail-type") not in (SPOT_WARNING, REBALANCE):
        return None
    if not isinstance(event.get("detail"), dict) or "instance-id" not in event["detail"]:
        return None
    return event


def _signal(event: dict, node: NodeInfo) -> HealthSignal:
    warning = event["detail-type"] == SPOT_WARNING
    action = event["detail"].get("instance-action", "")
    return HealthSignal(
        node=node.name, kind="spot_notice", severity="critical" if warning else "warning",
        message=(f"EC2 spot interruption warning: {action or 'terminate'} at {event.get('time')}"
                 if warning else "EC2 rebalance recommendation: interruption risk is high"),
        evidence={"event_id": event.get("id"), "detail_type": event["detail-type"],
                  "time": event.get("time"), "detail": event["detail"],
                  "provider_id": node.provider_id},
        key=interruption_key(event["detail"]["instance-id"], warning),
    )
