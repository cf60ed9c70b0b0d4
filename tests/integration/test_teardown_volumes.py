"""`make down PROFILE=aws` waits, between its two stacks, for the platform's etcd volume (trainkit/infra/aws.py,
wait_for_platform_volumes): the EBS CSI driver deletes it after its claim, asynchronously, and only while the cluster
runs, so destroying the infra stack first would leave it billed. On moto's EC2: the volume the StorageClass tags
(terraform/stacks/platform, etcd_storage_class), deleted while it waits, as the driver would; one never deleted."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from trainkit.infra import aws
from trainkit.infra.outputs import STACK_TAG

STACK, REGION = "trainkit-volumes", "us-east-1"


def etcd_volume(ec2, stack: str = STACK) -> str:
    tags = [
        {"Key": STACK_TAG, "Value": stack},
        {"Key": aws.PLATFORM_VOLUME_TAG[0], "Value": aws.PLATFORM_VOLUME_TAG[1]},
    ]
    spec = [{"ResourceType": "volume", "Tags": tags}]
    return ec2.create_volume(AvailabilityZone="us-east-1a", Size=1, VolumeType="gp3", TagSpecifications=spec)[
        "VolumeId"
    ]


@pytest.fixture
def ec2(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def test_down_waits_for_the_etcd_volume_and_says_how_to_delete_one_left(ec2):
    assert list(aws.wait_for_platform_volumes(STACK, REGION, timeout_s=5, poll_s=0.05)) == []  # none: nothing said
    etcd_volume(ec2, "another-stack")  # another stack's is not this one's to wait for
    volume = etcd_volume(ec2)
    waiting = aws.wait_for_platform_volumes(STACK, REGION, timeout_s=10, poll_s=0.05)
    assert next(waiting) == f"waiting for the EBS CSI driver to delete the platform's etcd volume {volume}"
    ec2.delete_volume(VolumeId=volume)  # the driver, once the claim is gone
    assert list(waiting) == ["the platform's etcd volume is deleted"]
    stuck = etcd_volume(ec2)
    *_, last = aws.wait_for_platform_volumes(STACK, REGION, timeout_s=0.2, poll_s=0.05)
    assert last == (
        f"the platform's etcd volume {stuck} is still there after 0 s (the EBS CSI driver deletes it once its claim is "
        f"gone); delete it yourself: aws ec2 delete-volume --region {REGION} --volume-id {stuck}"
    )
    assert stuck in aws.audit(STACK, REGION, "trainkit-volumes")  # and the audit after the destroy lists it
