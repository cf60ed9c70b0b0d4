"""ValidatingAdmissionPolicy as the API server applies it to a pod, for the stand-in (tests/helpers/kube_api.py): the
platform's policies and bindings (terraform/stacks/platform), their CEL evaluated by cel-python (CEL's Python
implementation; the expressions use only the standard language: has(), all(), `in`, lists and the ternary).

The rules, from Kubernetes' "Validating Admission Policy" page and the admissionregistration.k8s.io/v1 reference
(v1.33): a binding applies its policy (policyName) to requests that match the policy's matchConstraints and the
binding's matchResources (here: namespaceSelector over the namespace's labels, which carry
kubernetes.io/metadata.name); `variables` are evaluated by name and read as variables.<name>; the validations
run in order and the first whose expression is false denies, with validationActions Deny. The refusal
(staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go, admission.NewForbidden):
HTTP 422, reason Invalid (a validation's default), message `pods "<name>" is forbidden: ValidatingAdmissionPolicy
'<policy>' with binding '<binding>' denied request: <message>` (`failed expression: <expression>` without one).
"""

from __future__ import annotations

import celpy

from tests.helpers.network_policy import selects
from trainkit.backends.eks.render import NAMESPACE_NAME_LABEL


def _matches_pods(policy: dict, operation: str) -> bool:
    rules = policy["spec"].get("matchConstraints", {}).get("resourceRules", [])
    return any(
        "" in rule.get("apiGroups", [])
        and "pods" in rule.get("resources", [])
        and (operation in rule.get("operations", []) or "*" in rule.get("operations", []))
        for rule in rules
    )


def _selects_namespace(binding: dict, namespace: str) -> bool:
    selector = binding["spec"].get("matchResources", {}).get("namespaceSelector", {})  # none: every namespace
    return selects(selector, {NAMESPACE_NAME_LABEL: namespace})


def _evaluate(expression: str, activation: dict):
    environment = celpy.Environment()
    return environment.program(environment.compile(expression)).evaluate(activation)


def denial(objects: list[dict], namespace: str, pod: dict, operation: str = "CREATE") -> str | None:
    """The API server's message refusing `pod`, or None when every bound policy admits it."""
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    for binding in bindings:
        policy = policies.get(binding["spec"]["policyName"])
        if policy is None or not _matches_pods(policy, operation) or not _selects_namespace(binding, namespace):
            continue
        activation = {"object": celpy.json_to_cel(pod), "variables": celpy.celtypes.MapType({})}
        for variable in policy["spec"].get("variables", []):
            value = _evaluate(variable["expression"], activation)
            named = {**activation["variables"], celpy.celtypes.StringType(variable["name"]): value}
            activation["variables"] = celpy.celtypes.MapType(named)
        for validation in policy["spec"]["validations"]:
            if not _evaluate(validation["expression"], activation):
                message = validation.get("message") or f"failed expression: {validation['expression']}"
                return (
                    f'pods "{pod["metadata"]["name"]}" is forbidden: ValidatingAdmissionPolicy '
                    f"'{policy['metadata']['name']}' with binding '{binding['metadata']['name']}' denied request: "
                    f"{message}"
                )
    return None
