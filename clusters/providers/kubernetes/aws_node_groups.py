"""EC2 Auto Scaling behind node pools, and spot interruption notices.

A pool whose settings name an Auto Scaling group (`asg_name`) gets its nodes
replaced through the group: the failed instance is terminated without
lowering the desired capacity, so the group launches a new one. Nothing
here waits for it: a later cluster pass lists it and it joins as a spare,
and the same passes read the group's scaling activities (a launch that
failed, with AWS's message) and complete the termination lifecycle action
of an instance once its drain is done. Spot interruption warnings arrive as
EventBridge events in an SQS queue (`spot_queue_url`) and become spot-notice
health signals. Settings: docs/aws.md.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from controlplane.lib.errors import PermanentError, TemporaryError

from ..base import (
    HealthSignal,
    NodeInfo,
    PoolInfo,
    ScalingFailure,
    ScalingStatus,
    interruption_key,
)

SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
_TEMPORARY_CODES = {
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable",
    "InternalFailure", "InternalError", "RequestTimeout", "ScalingActivityInProgress",
    "ResourceContention",
}
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
FAILED_ACTIVITY = ("Failed", "Cancelled")
DONE_ACTIVITY = ("Successful", *FAILED_ACTIVITY)
ACTIVITY_PAGE = 20
# Activities are stamped by AWS's clock, asks by ours.
CLOCK_SKEW_S = 60.0
# A launch that failed for one of these will fail again however often it is
# asked, until someone changes the group or its launch template.
_PERMANENT_LAUNCH = ("Invalid", "not supported", "not authorized", "AccessDenied",
                     "does not exist", "not found", "Unsupported")
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


class AwsNodeGroups:
    """The Kubernetes provider's backend for pools that are EKS node groups
    (Auto Scaling groups): it grows, shrinks and replaces their instances and
    reads their spot notices. Not a Provider: the Kubernetes provider calls
    it, nothing registers it."""

    def __init__(self, session: Any, endpoint_url: str | None = None):
        kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
        self.autoscaling = session.client("autoscaling", **kwargs)
        self.ec2 = session.client("ec2", **kwargs)
        self.sqs = session.client("sqs", **kwargs)

    @classmethod
    def for_settings(cls, settings) -> AwsNodeGroups:
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
        """Terminate the instance without lowering desired capacity, so the
        group launches another, and return without waiting for it: the
        group is read once more, and a successor already there is returned;
        else a later pass lists it (`list_nodes`) and it joins as a spare,
        and `provision` asks for nothing more while the group is short. How
        the launch went is read later (`scaling_status`). Calling it again
        for an instance already gone terminates nothing more."""
        old = instance_id(provider_id)
        before = self._live_ids(self._group(pool))
        if old not in before:
            return None
        with classified(f"terminate {old}"):
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=old, ShouldDecrementDesiredCapacity=False)
        fresh = sorted(self._live_ids(self._group(pool)) - before)
        return self._describe(pool, fresh[:1])[0] if fresh else None

    def provision(self, pool: PoolInfo) -> NodeInfo | None:
        """One more instance for the pool's spares (desired capacity + 1).
        While the group is still short of its desired capacity (an earlier
        ask on its way, or failing), it is not asked for more: each pass
        would otherwise raise the capacity again until MaxSize."""
        group = self._group(pool)
        desired, ceiling = group["DesiredCapacity"], group["MaxSize"]
        before = self._live_ids(group)
        if len(before) < desired:
            return None
        if desired >= ceiling:
            raise PermanentError(
                f"Auto Scaling group {group['AutoScalingGroupName']} is at its MaxSize {ceiling}")
        with classified("set desired capacity"):
            self.autoscaling.set_desired_capacity(
                AutoScalingGroupName=group["AutoScalingGroupName"], DesiredCapacity=desired + 1,
                HonorCooldown=False)
        fresh = sorted(self._live_ids(self._group(pool)) - before)
        return self._describe(pool, fresh[:1])[0] if fresh else None

    def scaling_status(self, pool: PoolInfo, since: datetime) -> ScalingStatus:
        """The group's scaling activities since `since` (less a clock-skew
        margin): failed or cancelled ones with AWS's message, and whether the
        group has settled (at its desired capacity, nothing in progress).
        One page of the newest activities: a pass looks often enough that
        older ones were read by an earlier pass."""
        group = self._group(pool)
        name = group["AutoScalingGroupName"]
        with classified(f"describe scaling activities of {name}"):
            activities = self.autoscaling.describe_scaling_activities(
                AutoScalingGroupName=name, MaxRecords=ACTIVITY_PAGE)["Activities"]
        floor = since - timedelta(seconds=CLOCK_SKEW_S)
        recent = [a for a in activities if a.get("StartTime") and a["StartTime"] >= floor]
        failures = tuple(_failure(a) for a in sorted(recent, key=lambda a: a["StartTime"])
                         if a.get("StatusCode") in FAILED_ACTIVITY)
        busy = any(a.get("StatusCode") not in DONE_ACTIVITY for a in recent)
        short = len(self._live_ids(group)) < group["DesiredCapacity"]
        return ScalingStatus(settled=not busy and not short, failures=failures)

    def release(self, pool: PoolInfo, provider_id: str) -> str | None:
        """Complete the termination lifecycle action of an instance this
        control plane terminated and drained, so the group lets it go now
        rather than at the hook's timeout. What was done ("" when nothing
        held it: gone, past its hooks, or no hook); None while it has not
        reached `Terminating:Wait` yet."""
        iid = instance_id(provider_id)
        group = self._group(pool)
        name = group["AutoScalingGroupName"]
        state = next((i.get("LifecycleState", "") for i in group.get("Instances", [])
                      if i["InstanceId"] == iid), None)
        if state == "Terminating":
            return None  # on its way to the hook's wait: look again
        if state != "Terminating:Wait":
            return ""
        with classified(f"describe lifecycle hooks of {name}"):
            hooks = self.autoscaling.describe_lifecycle_hooks(
                AutoScalingGroupName=name)["LifecycleHooks"]
        done = [hook["LifecycleHookName"] for hook in hooks
                if hook.get("LifecycleTransition") == TERMINATING]
        for hook in done:
            self._complete(name, hook, iid)
        return (f"termination lifecycle action of {iid} completed (CONTINUE, "
                f"{', '.join(done)})") if done else ""

    def _complete(self, group: str, hook: str, iid: str) -> None:
        from botocore.exceptions import ClientError

        try:
            with classified(f"complete lifecycle action of {iid}"):
                self.autoscaling.complete_lifecycle_action(
                    AutoScalingGroupName=group, LifecycleHookName=hook, InstanceId=iid,
                    LifecycleActionResult="CONTINUE")
        except PermanentError as exc:
            # "No active Lifecycle Action found": completed already (a pass
            # before, or a handler of the hook's own), or timed out.
            cause = exc.__cause__
            if not (isinstance(cause, ClientError)
                    and cause.response.get("Error", {}).get("Code") == "ValidationError"):
                raise

    # --- spot notices ------------------------------------------------------------
    def spot_signals(self, pool: PoolInfo) -> list[HealthSignal]:
        """Interruption warnings for this pool's instances, read from the SQS
        queue an EventBridge rule feeds.

        One queue often serves several clusters, and SQS hands out messages
        in no order of ours: a sweep that stopped after a few batches of
        other clusters' notices would meet its own several sweeps later. So
        a sweep receives until the queue shows nothing new (at most
        `spot_max_batches` batches of ten), each message hidden meanwhile,
        and only then sorts them, with one `describe_auto_scaling_groups`,
        at most one `describe_instances` for the other clusters' instances
        and one for ours, and the acknowledgements in batches of ten. With
        150 other clusters' notices ahead of ours, ours is a signal on the
        first sweep, in 36 AWS calls (docs/performance.md; reading ten
        batches a sweep and hiding each foreign notice with a call of its
        own, it came on the second sweep, after 121 + 65 calls).

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
        received: dict[str, dict] = {}
        for _ in range(pool.settings.spot_max_batches):
            with classified("receive spot notices"):
                messages = self.sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                    # Hidden until this sweep has sorted them, however many it reads.
                    VisibilityTimeout=max(30, hide)).get("Messages", [])
            fresh = {m["MessageId"]: m for m in messages if m["MessageId"] not in received}
            if not fresh:
                break
            received.update(fresh)
        if not received:
            return []
        return self._sort_notices(pool, url, self._group(pool), list(received.values()), hide)

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
        theirs = [m for m, iid in others if iid not in gone]
        with classified("acknowledge spot notices"):
            for chunk in _chunks(theirs, 10):
                self.sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": hide}
                    for i, m in enumerate(chunk)])
            for chunk in _chunks(done, 10):
                self.sqs.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(chunk)])
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
            states = {}
            for chunk in _chunks(sorted(ids), 200):  # EC2's limit of values per filter
                pages = self.ec2.get_paginator("describe_instances").paginate(
                    Filters=[{"Name": "instance-id", "Values": chunk}])
                states.update({i["InstanceId"]: i.get("State", {}).get("Name", "")
                               for page in pages for r in page["Reservations"]
                               for i in r["Instances"]})
        return {i for i in ids if i in leaving or i not in states
                or states[i] in ("shutting-down", "terminated")}


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _failure(activity: dict) -> ScalingFailure:
    message = activity.get("StatusMessage") or activity.get("Description", "")
    return ScalingFailure(
        activity_id=activity.get("ActivityId", ""), status=activity.get("StatusCode", ""),
        message=message, description=activity.get("Description", ""),
        started_at=activity["StartTime"].isoformat(),
        permanent=any(word in message for word in _PERMANENT_LAUNCH)
        and "capacity" not in message.lower())


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
