"""Where trainkit keeps its state and finds the project's Terraform, for a checkout or an installed package.

State (`.trainkit/`: local servers, the aws profile's Terraform state, kubeconfig and outputs) lives in
the project: the checkout this package was installed from in editable mode, else the folder commands
run from (`TRAINKIT_STATE_DIR` moves it). Terraform stacks are not Python package data: infra commands
use that project's `terraform/` (`TRAINKIT_TERRAFORM_DIR` names another).
"""

from __future__ import annotations

import os
from pathlib import Path

from trainkit.errors import SpecError

STATE_ENV = "TRAINKIT_STATE_DIR"
TERRAFORM_ENV = "TRAINKIT_TERRAFORM_DIR"
_CHECKOUT = Path(__file__).resolve().parents[1]  # the repository, when installed editable


def _project_roots() -> list[Path]:
    """Where a trainkit project may be: the checkout this package runs from (an editable install), then
    the folder commands run from (a non-editable install used inside a project)."""
    return [_CHECKOUT, Path.cwd()]


def project_root() -> Path:
    """The first of `_project_roots` holding terraform/stacks, else the folder commands run from."""
    return next((root for root in _project_roots() if (root / "terraform" / "stacks").is_dir()), Path.cwd())


def state_dir() -> Path:
    """`.trainkit/` of the project (not of whichever sub-folder `invoke` ran from: the aws profile's
    Terraform state must be one), or `TRAINKIT_STATE_DIR`."""
    return Path(os.environ.get(STATE_ENV) or project_root() / ".trainkit").resolve()


def terraform_dir() -> Path:
    """The project's terraform/ folder (holding stacks/ and modules/)."""
    if os.environ.get(TERRAFORM_ENV):
        candidates = [Path(os.environ[TERRAFORM_ENV]).expanduser()]
    else:
        candidates = [root / "terraform" for root in _project_roots()]
    for candidate in candidates:
        if (candidate / "stacks").is_dir():
            return candidate.resolve()
    raise SpecError(
        f"no Terraform stacks found (looked in {', '.join(str(c.resolve()) for c in candidates)}): run infra "
        f"commands from a trainkit checkout, or set {TERRAFORM_ENV} to its terraform/ folder"
    )
