"""The Kubernetes version the offline schema checks validate against."""

from __future__ import annotations

import functools
import re

from tests.helpers.paths import REPO


@functools.cache
def kubernetes_version() -> str:
    """The version the infra stack creates (variables.tf default), as kubernetes-validate names it."""
    text = (REPO / "terraform" / "stacks" / "infra" / "variables.tf").read_text()
    found = re.search(r'variable "kubernetes_version" \{[^}]*?default\s*=\s*"([0-9.]+)"', text, re.S)
    return found[1] + ".0"
