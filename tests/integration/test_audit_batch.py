"""`make down PROFILE=aws` and `infra.audit` with AWS Batch (trainkit/infra/aws.py): the stack's compute environment,
job queue, job definitions and jobs not yet ended are listed by the stack's tag; before the destroy, `make down` ends
the jobs and deregisters the job definitions (Terraform manages neither), and an ended job or a deregistered job
definition, which Batch keeps listing for a while, is not a leftover. On moto's in-process emulator without Docker,
whose SubmitJob ends a job at once (SUCCEEDED): a test that needs a job still running counts that state as one, as
tests/integration/test_audit_training_jobs.py does for SageMaker."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from trainkit.infra import aws
from trainkit.infra.outputs import STACK_TAG

STACK = "trainkit-audit"
TAGS = {STACK_TAG: STACK}
REGION = "us-east-1"


@pytest.fixture
def batch(monkeypatch):
    """The stack's Batch part as the module makes it (a p5 EC2 environment from 0 vCPUs, its queue) and, as the Batch
    backend registers them, a tagged multi-node job definition and a job; beside them another stack's queue."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws(config={"batch": {"use_docker": False}}):
        session = boto3.session.Session(region_name=REGION)
        ec2, iam, client = session.client("ec2"), session.client("iam"), session.client("batch")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName="tk-batch", Description="batch", VpcId=vpc)["GroupId"]
        trust = json.dumps({"Version": "2012-10-17", "Statement": []})
        iam.create_role(RoleName="tk-batch-instance", AssumeRolePolicyDocument=trust)
        profile = iam.create_instance_profile(InstanceProfileName="tk-batch-instance")["InstanceProfile"]
        iam.add_role_to_instance_profile(InstanceProfileName="tk-batch-instance", RoleName="tk-batch-instance")
        # moto wants a service role; AWS Batch uses its service-linked role when none is given (as the module does).
        service = iam.create_role(RoleName="tk-batch-service", AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        environment = client.create_compute_environment(
            computeEnvironmentName="tk-batch",
            type="MANAGED",
            state="ENABLED",
            serviceRole=service,
            computeResources={
                "type": "EC2",
                "minvCpus": 0,
                "maxvCpus": 384,
                "instanceTypes": ["p5.48xlarge"],
                "subnets": [subnet],
                "securityGroupIds": [group],
                "instanceRole": profile["Arn"],
            },
            tags=TAGS,
        )["computeEnvironmentArn"]
        # moto 5.2.1 gives the ECS cluster its Batch makes no tag list, on which its tagging API then fails: one tag.
        ecs = session.client("ecs")
        for cluster in ecs.list_clusters()["clusterArns"]:
            ecs.tag_resource(resourceArn=cluster, tags=[{"key": "made-by", "value": "batch"}])
        order = [{"order": 1, "computeEnvironment": environment}]
        queue = client.create_job_queue(
            jobQueueName="tk-batch", state="ENABLED", priority=1, computeEnvironmentOrder=order, tags=TAGS
        )
        client.create_job_queue(jobQueueName="other-batch", state="ENABLED", priority=1, computeEnvironmentOrder=order)
        node = {"targetNodes": "0:", "container": {"image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1"}}
        definition = client.register_job_definition(
            jobDefinitionName="bert-tiny-abc",
            type="multinode",
            nodeProperties={"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [node]},
            tags=TAGS,
            propagateTags=True,
        )["jobDefinitionArn"]
        job = client.submit_job(
            jobName="bert-tiny-abc", jobQueue=queue["jobQueueArn"], jobDefinition=definition, tags=TAGS
        )
        yield {
            "client": client,
            "environment": environment,
            "queue": queue["jobQueueArn"],
            "definition": definition,
            "job": job["jobArn"],
            "job_id": job["jobId"],
        }


def test_the_stacks_batch_part_is_left_over_until_destroyed(batch):
    left = aws.audit(STACK, REGION, "trainkit")
    assert batch["environment"] in left and batch["queue"] in left and batch["definition"] in left
    assert not [item for item in left if "other-batch" in item], left
    assert batch["job"] not in left  # ended at once on the emulator: billed nothing


def test_a_running_job_is_listed(batch, monkeypatch):
    monkeypatch.setattr(aws, "BATCH_ACTIVE", ("SUCCEEDED",))  # moto's jobs end at once: count that as running
    assert batch["job"] in aws.audit(STACK, REGION, "trainkit")


def test_make_down_ends_the_jobs_and_deregisters_the_job_definitions_first(batch, monkeypatch):
    monkeypatch.setattr(aws, "BATCH_ACTIVE", ("SUCCEEDED",))
    done = aws.release_batch(STACK, REGION)
    assert done == [
        f"terminated the Batch job {batch['job']}",
        f"deregistered the Batch job definition {batch['definition']}",
    ]
    (job,) = batch["client"].describe_jobs(jobs=[batch["job_id"]])["jobs"]
    assert job["statusReason"] == "make down PROFILE=aws: the stack is being destroyed"
    (definition,) = batch["client"].describe_job_definitions(jobDefinitions=[batch["definition"]])["jobDefinitions"]
    assert definition["status"] == "INACTIVE"
    left = aws.audit(STACK, REGION, "trainkit")
    assert batch["definition"] not in left, "a deregistered job definition bills nothing"


def test_what_terraform_destroys_is_no_longer_listed(batch):
    client = batch["client"]
    aws.release_batch(STACK, REGION)
    client.update_job_queue(jobQueue=batch["queue"], state="DISABLED")
    client.delete_job_queue(jobQueue=batch["queue"])
    client.update_compute_environment(computeEnvironment=batch["environment"], state="DISABLED")
    client.delete_compute_environment(computeEnvironment=batch["environment"])
    assert not [item for item in aws.audit(STACK, REGION, "trainkit") if ":batch:" in item]
