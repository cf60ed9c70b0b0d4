"""Where trainkit keeps its state and finds the project's Terraform, for a checkout or an installed package.

State (`.trainkit/`: local servers, the aws profile's Terraform state, kubeconfig and outputs) lives in
the project: the checkout this package was installed from in editable mode, else the folder commands
run from (`TRAINKIT_STATE_DIR` moves it). It is the user's alone (0700: `make_folder` makes it so,
`private_folder` checks it): what is in it is trusted (a kubeconfig, Terraform state) or secret. Terraform
stacks are not Python package data: infra commands use that project's `terraform/` (`TRAINKIT_TERRAFORM_DIR`
names another).
"""

from __future__ import annotations

import os
import stat
import sys
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
    Terraform state must be one), or `TRAINKIT_STATE_DIR`. Not made here (a dry run creates nothing): what writes
    into it makes it with `make_folder`; one that exists is checked (`private_folder`) by every reader."""
    path = Path(os.environ.get(STATE_ENV) or project_root() / ".trainkit").resolve()
    if path.exists():
        _private_state(path)
    return path


def make_folder(path: Path) -> Path:
    """`mkdir -p path` for what trainkit writes; when `path` is in the state folder, that folder is made first, 0700."""
    state = state_dir()
    if path.is_relative_to(state):
        _private_state(state)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _private_state(path: Path) -> Path:
    remedy = f"remove it, or `chmod 700 {path}` if it is yours, or set {STATE_ENV} to a folder of your own"
    return private_folder(path, "the state folder", remedy, repair=True)


def private_folder(path: Path, what: str, remedy: str, repair: bool = False) -> Path:
    """`path` as a folder only this user can read or write: made 0700 when missing (missing parents as the umask
    says). An existing one must be a folder (not a link) of this user's that nobody else can write to, else a
    SpecError naming `what` and saying `remedy`; read and search rights others still have on it are taken away.
    `repair`: one of this user's that others could write to is made 0700 with a note instead (the state folder, which
    a umask of 002 made group-writable before trainkit made it private)."""
    try:
        path.mkdir(mode=0o700, parents=True)
        return path
    except FileExistsError:
        pass
    found = path.lstat()
    problem = None
    if not stat.S_ISDIR(found.st_mode):
        problem = "is not a folder"
    elif found.st_uid != os.getuid():
        problem = f"belongs to another user (uid {found.st_uid}; you are {os.getuid()})"
    elif found.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not repair:
        problem = f"can be written by other users (mode {stat.S_IMODE(found.st_mode):o})"
    if problem:
        raise SpecError(f"{what} {path} {problem}: whoever can write there can plant what trainkit runs; {remedy}")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # This user's own, made under a umask of 002 (Debian's and Ubuntu's default with per-user groups): made
        # private, and said once, since until now others of its group could write there.
        print(
            f"note: {what} {path} could be written by other users (mode {stat.S_IMODE(found.st_mode):o}); it is "
            "now yours alone (700): check what it holds if others share this machine",
            file=sys.stderr,
        )
    if found.st_mode & 0o077:
        path.chmod(0o700)
    return path


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
