"""Where trainkit keeps its state and finds the project's Terraform, for a checkout or an installed package.

State (`.trainkit/`: local servers, the aws profile's Terraform state, kubeconfig and outputs) lives in
the folder commands run from (`TRAINKIT_STATE_DIR` moves it). Terraform stacks are not Python package
data: infra commands use the `terraform/` of the project they run in (the folder commands run from, else
the checkout this package was installed from in editable mode; `TRAINKIT_TERRAFORM_DIR` names another).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SpecError

STATE_ENV = "TRAINKIT_STATE_DIR"
TERRAFORM_ENV = "TRAINKIT_TERRAFORM_DIR"
_CHECKOUT = Path(__file__).resolve().parents[1]  # the repository, when installed editable


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV, ".trainkit")).resolve()


def terraform_dir() -> Path:
    """The project's terraform/ folder (holding stacks/ and modules/)."""
    if os.environ.get(TERRAFORM_ENV):
        candidates = [Path(os.environ[TERRAFORM_ENV]).expanduser()]
    else:
        candidates = [Path("terraform"), _CHECKOUT / "terraform"]
    for candidate in candidates:
        if (candidate / "stacks").is_dir():
            return candidate.resolve()
    raise SpecError(
        f"no Terraform stacks found (looked in {', '.join(str(c.resolve()) for c in candidates)}): run infra "
        f"commands from a trainkit checkout, or set {TERRAFORM_ENV} to its terraform/ folder"
    )
