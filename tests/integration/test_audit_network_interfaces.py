"""`infra.audit` and network interfaces (trainkit/infra/aws.py), on moto's in-process emulator: an interface tagged
with the stack id is listed wherever it is, and so is every interface left in the stack's VPC whatever its tags, such
as the `available` ones the VPC CNI leaks with only its own tags (they hold up the VPC's deletion). Another VPC's
interfaces are not the stack's."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from trainkit.infra import aws
from trainkit.infra.outputs import STACK_TAG

STACK = "trainkit-audit"
REGION = "us-east-1"


def tag_spec(resource: str, tags: dict[str, str]) -> list[dict]:
    return [{"ResourceType": resource, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


@pytest.fixture
def ec2(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield boto3.session.Session(region_name=REGION).client("ec2")


def subnet_in_new_vpc(ec2, cidr: str, tags: dict[str, str]) -> tuple[str, str]:
    vpc = ec2.create_vpc(CidrBlock=cidr, TagSpecifications=tag_spec("vpc", tags))["Vpc"]["VpcId"]
    return vpc, ec2.create_subnet(VpcId=vpc, CidrBlock=cidr.replace("/16", "/24"))["Subnet"]["SubnetId"]


def interface(ec2, subnet: str, description: str, tags: dict[str, str]) -> str:
    made = ec2.create_network_interface(
        SubnetId=subnet, Description=description, TagSpecifications=tag_spec("network-interface", tags)
    )
    return made["NetworkInterface"]["NetworkInterfaceId"]


def test_the_audit_finds_an_interface_left_in_the_stacks_vpc_that_we_never_tagged(ec2):
    vpc, subnet = subnet_in_new_vpc(ec2, "10.0.0.0/16", {STACK_TAG: STACK})
    # What the VPC CNI leaves behind after its node is gone: `available`, with its own tags only.
    leaked = interface(ec2, subnet, "aws-K8S-i-0123456789abcdef0", {"cluster.k8s.amazonaws.com/name": "trainkit"})
    left = aws.audit(STACK, REGION, "trainkit")
    assert vpc in left
    assert f"{leaked} (available, aws-K8S-i-0123456789abcdef0)" in left


def test_tagged_interfaces_are_listed_once_and_other_vpcs_are_left_alone(ec2):
    _, other_subnet = subnet_in_new_vpc(ec2, "10.1.0.0/16", {STACK_TAG: "someone-else"})
    tagged = interface(ec2, other_subnet, "", {STACK_TAG: STACK})  # the stack id, outside the stack's VPC
    theirs = interface(ec2, other_subnet, "", {})
    _, subnet = subnet_in_new_vpc(ec2, "10.0.0.0/16", {STACK_TAG: STACK})
    tagged_inside = interface(ec2, subnet, "EFA", {STACK_TAG: STACK})  # found by both searches
    left = aws.audit(STACK, REGION, "trainkit")
    assert f"{tagged} (available, no description)" in left
    assert [item for item in left if tagged_inside in item] == [f"{tagged_inside} (available, EFA)"]
    assert not [item for item in left if theirs in item]
    assert not [item for item in left if ":network-interface/" in item], "by id, not again by ARN"
