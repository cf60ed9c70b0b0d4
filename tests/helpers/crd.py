"""What a cluster running training-operator v1.9.4 accepts as a PyTorchJob, checked here.

Two checks, as the API server runs them on create:
1. The CRD's openAPIV3Schema (tests/schemas/pytorchjob-v1.json, generated from kubeflow/trainer at
   v1.9.4 by tests/schemas/generate.py; its `source` names file, commit and digest), made strict: an
   object with `properties` accepts no other field unless the schema says so
   (`additionalProperties`, `x-kubernetes-preserve-unknown-fields`). A real API server prunes unknown
   fields under the default field validation; `kubectl --validate=strict` and we refuse them, so a
   misspelt field fails here instead of vanishing there.
2. The operator's validating webhook for our shape, re-written from
   pkg/webhooks/pytorch/pytorchjob_webhook.go at v1.9.4 (validatePyTorchJob, validateSpec,
   validatePyTorchReplicaSpecs L75-161) and pkg/common/util/webhooks.go (ValidateRunPolicy): the name is a
   DNS-1035 label; elasticPolicy needs a Worker spec and forbids elasticPolicy.nProcPerNode with
   spec.nprocPerNode; only Master/Worker replica types; containers present, each with an image, one named
   `pytorch`; Master replicas exactly 1, Worker replicas at least 1; runPolicy.managedBy one the operator
   supports.
"""

from __future__ import annotations

import json
import re

import jsonschema

from tests.helpers.paths import PYTORCHJOB_SCHEMA

WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"  # manifests/base/webhook/manifests.yaml L55
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")  # pkg/common/util/webhooks.go
SOURCE = json.loads(PYTORCHJOB_SCHEMA.read_text())["source"]


def strict(node):
    """The schema with `additionalProperties: false` wherever fields are listed and nothing else is allowed."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def _schema() -> dict:
    schema = strict(json.loads(PYTORCHJOB_SCHEMA.read_text())["openAPIV3Schema"])
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    schema["properties"]["apiVersion"] = {"const": "kubeflow.org/v1"}
    schema["properties"]["kind"] = {"const": "PyTorchJob"}
    return schema


VALIDATOR = jsonschema.Draft7Validator(_schema())


def schema_errors(job: dict) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(VALIDATOR.iter_errors(job), key=lambda e: list(map(str, e.absolute_path)))
    ]


def webhook_errors(job: dict) -> list[str]:
    errors = []
    name = job.get("metadata", {}).get("name", "")
    if not (DNS1035.match(name) and len(name) <= 63):
        errors.append(f'metadata.name: Invalid value: "{name}": should match: a lowercase RFC 1035 label')
    spec = job.get("spec", {})
    managed = spec.get("runPolicy", {}).get("managedBy")
    if managed is not None and managed not in MANAGED_BY:
        errors.append(f'spec.runPolicy.managedBy: Unsupported value: "{managed}"')
    replicas = spec.get("pytorchReplicaSpecs")
    if spec.get("elasticPolicy") is not None:
        if "Worker" not in (replicas or {}):
            errors.append(
                "spec.pytorchReplicaSpecs[Worker]: Required value: must be configured if elastic policy is used"
            )
        if spec["elasticPolicy"].get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            errors.append("spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with spec.nprocPerNode")
    if replicas is None:
        errors.append("spec.pytorchReplicaSpecs: Required value: must be required")
    for role, replica in (replicas or {}).items():
        path = f"spec.pytorchReplicaSpecs[{role}]"
        if role not in ("Master", "Worker"):
            errors.append(f'{path}: Unsupported value: "{role}": supported values: "Master", "Worker"')
        containers = ((replica or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if not containers:
            errors.append(f"{path}.template.spec.containers: Required value: must be specified")
        for index, container in enumerate(containers):
            if not container.get("image"):
                errors.append(f"{path}.template.spec.containers[{index}].image: Required value: must be required")
        if not any(container.get("name") == "pytorch" for container in containers):
            errors.append(
                f"{path}.template.spec.containers: Required value: must have at least one container with name pytorch"
            )
        count = (replica or {}).get("replicas")
        if role == "Master" and count != 1:
            errors.append(f"{path}.replicas: Forbidden: must be 1")
        elif role != "Master" and count is not None and count < 1:
            errors.append(f"{path}.replicas: Forbidden: must be at least 1")
    return errors


def admission_errors(job: dict) -> tuple[int, str] | None:
    """None when the API server would create the job; else (HTTP code, message) as it answers."""
    if found := schema_errors(job):
        return 422, f'PyTorchJob.kubeflow.org "{job.get("metadata", {}).get("name")}" is invalid: ' + "; ".join(found)
    if found := webhook_errors(job):
        return 400, f'admission webhook "{WEBHOOK}" denied the request: ' + "; ".join(found)
    return None
