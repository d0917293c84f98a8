"""The control plane's IAM policy (deploy/overlays/eks/control-plane-iam-policy.json)
allows every AWS call the Auto Scaling and spot-notice adapter makes.

The calls are read from clusters/providers/kubernetes/aws_node_groups.py
itself (`self.<client>.<op>(` and paginators), named as IAM names them
through botocore's service models, so a call added there without its
permission fails here rather than with AccessDenied on a real account.
"""

import json
import re
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "overlays" / "eks" / "control-plane-iam-policy.json"
ADAPTER = ROOT / "clusters" / "providers" / "kubernetes" / "aws_node_groups.py"
# SQS authorises a batch call by its single call's action.
BATCHED = {"sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
           "sqs:DeleteMessageBatch": "sqs:DeleteMessage"}


def allowed() -> set[str]:
    policy = json.loads(POLICY.read_text())
    assert policy["Version"] == "2012-10-17"
    return {action for s in policy["Statement"] if s["Effect"] == "Allow"
            for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}


def called() -> set[str]:
    source = ADAPTER.read_text()
    ops = set(re.findall(r"self\.(autoscaling|ec2|sqs)\.(\w+)\(", source))
    ops |= {("ec2", op) for op in re.findall(r'ec2\.get_paginator\("(\w+)"\)', source)}
    actions = set()
    for service, op in ops:
        if op in ("get_paginator", "meta"):
            continue
        client = boto3.client(service, region_name="us-east-1", aws_access_key_id="x",
                              aws_secret_access_key="x")
        name = f"{service}:{client.meta.method_to_api_mapping[op]}"
        actions.add(BATCHED.get(name, name))
    return actions


def test_the_policy_allows_every_call_of_the_aws_adapter():
    calls = called()
    assert {"autoscaling:DescribeScalingActivities", "autoscaling:DescribeLifecycleHooks",
            "autoscaling:CompleteLifecycleAction"} <= calls
    assert calls - allowed() == set()
