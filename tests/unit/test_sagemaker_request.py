"""Which encryption settings a SageMaker request carries: the stack's key on the output always, on the volume only
where SageMaker accepts one (an instance type without local storage), and the stack's inter-container choice."""

from __future__ import annotations

from dataclasses import replace

from trainkit.backends.sagemaker import request
from trainkit.backends.sagemaker.stack import PLACEHOLDER
from trainkit.hardware import INSTANCE_TYPES

KEY = "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
STACK = replace(PLACEHOLDER, kms_key_arn=KEY)


def test_no_volume_key_for_a_type_with_local_storage():
    # SageMaker API reference, ResourceConfig.VolumeKmsKeyId: "You can't request a VolumeKmsKeyId when using an
    # instance type with local storage"; every type of the instance table has NVMe instance storage.
    assert INSTANCE_TYPES
    for name in INSTANCE_TYPES:
        assert request.has_instance_store(f"ml.{name}")
        assert request.volume_encryption(name, STACK) == {}


def test_the_stacks_key_on_the_volume_of_a_type_without_local_storage(monkeypatch):
    monkeypatch.setattr(request, "has_instance_store", lambda instance_type: False)
    assert request.volume_encryption("p5.48xlarge", STACK) == {"VolumeKmsKeyId": KEY}
    assert request.volume_encryption("p5.48xlarge", replace(STACK, kms_key_arn=None)) == {}  # an older record


def test_a_type_the_table_does_not_know_gets_no_volume_key():
    assert request.has_instance_store("ml.g9.huge")


def test_the_output_is_encrypted_with_the_stacks_key_when_recorded():
    assert request.output_config(STACK, "s3://b/runs/r1") == {"S3OutputPath": "s3://b/runs/r1/output", "KmsKeyId": KEY}
    older = replace(STACK, kms_key_arn=None)  # outputs from before the stack exported its key: the bucket's default
    assert request.output_config(older, "s3://b/runs/r1") == {"S3OutputPath": "s3://b/runs/r1/output"}
