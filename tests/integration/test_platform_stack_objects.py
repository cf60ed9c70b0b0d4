"""Every Kubernetes object of the platform root (terraform/stacks/platform), rendered from its HCL with the
variables' defaults and sample infra outputs (tests/helpers/platform_stack.py), is valid for the cluster's
Kubernetes version: kubernetes-validate, strict."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.helpers.kubernetes import kubernetes_version
from tests.helpers.platform_stack import manifests


def test_every_kubernetes_object_is_valid_for_the_clusters_version():
    objects = manifests()
    kinds = sorted({obj["kind"] for _, obj in objects})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CronJob",
        "Deployment",
        "Job",
        "Namespace",
        "NetworkPolicy",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "ResourceQuota",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "StatefulSet",
        "StorageClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for name, obj in objects:
        try:
            kubernetes_validate.validate(obj, kubernetes_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"kubernetes_manifest.{name}: {error}")


def test_validation_would_catch_a_mistake():
    _, statefulset = next((n, o) for n, o in manifests() if o["kind"] == "StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, kubernetes_version(), strict=True)
