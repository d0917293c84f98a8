"""moto's server as the AWS stand-in: real HTTP on 127.0.0.1, real boto3.

AWS cannot be reached from the test machines; moto answers the same API
(Auto Scaling, EC2, SQS, S3) from memory, and replaces an Auto Scaling
instance that is terminated without lowering the desired capacity, as AWS
does.
"""

from __future__ import annotations

import os
import uuid

import boto3
import pytest

REGION = "us-east-1"
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION,
}


@pytest.fixture(scope="session")
def moto_url():
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in _CREDENTIALS}
    os.environ.update(_CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def aws(moto_url):
    """The AWS stand-in. It is shared by the session (a reset costs seconds),
    so each test names its resources with `unique()`."""
    return moto_url


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def client(service: str, url: str):
    return boto3.client(service, region_name=REGION, endpoint_url=url)


def make_group(url: str, name: str = "h100-nodes", size: int = 2, max_size: int = 4,
               instance_type: str = "p5.48xlarge") -> list[str]:
    """A launch template and an Auto Scaling group of `size` instances; their ids."""
    ec2 = client("ec2", url)
    ec2.create_launch_template(
        LaunchTemplateName=f"{name}-lt",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": instance_type},
    )
    asg = client("autoscaling", url)
    asg.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=max_size, DesiredCapacity=size,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt", "Version": "$Latest"},
        AvailabilityZones=[f"{REGION}a"],
    )
    return group_instances(url, name)


def group_instances(url: str, name: str) -> list[str]:
    groups = client("autoscaling", url).describe_auto_scaling_groups(
        AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return sorted(i["InstanceId"] for i in groups[0]["Instances"])
