"""A small adapter over python-terraform for one stack directory: init, plan, apply, destroy, outputs.

python-terraform (the user's pick) has been unmaintained since 2019. Against Terraform 1.11 its
convenience wrappers break: `destroy()` passes the removed `-force` flag, `output(name)` raises, and
`plan(dir)` passes the directory as a positional argument that Terraform no longer accepts. Its
generic `cmd()` is sound, so everything here goes through `cmd()` with explicit flags, and the
adapter is tested against a real Terraform binary (tests/integration/test_infra_driver.py).

python-terraform copies `os.environ` into the child at call time and takes no env argument, so the
adapter sets the few variables it needs (the CLI config that points at the offline provider
mirror, TF_IN_AUTOMATION) in this process's environment for the duration of each call.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from python_terraform import IsFlagged, Terraform

from trainkit.errors import SpecError
from trainkit.infra.cli_config import write_cli_config


class TerraformError(RuntimeError):
    def __init__(self, command: str, code: int, stderr: str | None):
        lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
        # Terraform's diagnostics start "Error: <summary>" and go on with where it was; the summary says what.
        detail = next((line for line in lines if line.startswith("Error: ")), lines[-1] if lines else "")
        super().__init__(f"terraform {command} failed (exit {code})" + (f": {detail}" if detail else ""))
        self.command, self.code, self.stderr = command, code, stderr


@dataclass
class PlanSummary:
    """What a saved plan would do: counts per action and the resources it touches."""

    path: Path
    changes: Counter
    resources: list[dict]
    variables: dict

    @property
    def has_changes(self) -> bool:
        return any(action != "no-op" for action in self.changes)

    def count(self, resource_type: str, action: str = "create") -> int:
        return sum(1 for r in self.resources if r["type"] == resource_type and action in r["actions"])

    def describe(self) -> str:
        parts = [f"{self.changes.get(a, 0)} to {a}" for a in ("create", "update", "delete")]
        return "Plan: " + ", ".join(parts)


class TerraformStack:
    def __init__(self, directory: Path, state_dir: Path, extra_env: dict[str, str] | None = None):
        binary = shutil.which("terraform")
        if binary is None:
            raise SpecError("terraform is not installed: install Terraform >= 1.9 and make sure it is on PATH")
        self.directory = Path(directory)
        self.state_dir = Path(state_dir)
        self.env = {
            "TF_CLI_CONFIG_FILE": str(write_cli_config(self.state_dir)),
            "TF_IN_AUTOMATION": "1",
            "TF_DATA_DIR": str(self.state_dir / "tf-data"),  # keeps .terraform out of the repository
        }
        self.env.update(extra_env or {})
        self.tf = Terraform(working_dir=str(self.directory), terraform_bin_path=binary)

    @contextlib.contextmanager
    def _environment(self):
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _run(self, command: str, *args: str, stream: bool = False, **options) -> str:
        """`stream`: Terraform's progress (stdout) goes to the console as it comes; its stderr, where the errors are,
        is kept so a failure can say what it was (and shown once the command ends)."""
        options.setdefault("no_color", IsFlagged)
        with self._environment():
            if stream:
                with _kept_stderr() as kept:
                    code, out, _ = self.tf.cmd(command, *args, capture_output=False, **options)
                err = kept.text
            else:
                code, out, err = self.tf.cmd(command, *args, capture_output=True, **options)
        if code not in (0, 2) or (code == 2 and command != "plan"):
            raise TerraformError(command, code, err)
        return out or ""

    def init(self) -> None:
        """Initialise; roots declare `backend "local" {}` and their state lives in the state dir."""
        self._run(
            "init", input=False, upgrade=False, backend_config={"path": str(self.state_dir / "terraform.tfstate")}
        )

    def plan(self, var_file: Path | None = None, destroy: bool = False, stream: bool = True) -> PlanSummary:
        """Write a saved plan under the state dir and summarise it from `terraform show -json`."""
        plan_path = self.state_dir / ("destroy.tfplan" if destroy else "apply.tfplan")
        self._run(
            "plan",
            stream=stream,
            input=False,
            out=str(plan_path),
            var_file=str(var_file) if var_file else None,
            destroy=IsFlagged if destroy else None,
        )
        shown = json.loads(self._run("show", str(plan_path), json=IsFlagged))
        resources = [
            {"address": r["address"], "type": r["type"], "actions": r["change"]["actions"]}
            for r in shown.get("resource_changes", [])
        ]
        changes = Counter(action for r in resources for action in r["actions"])
        variables = {name: item.get("value") for name, item in shown.get("variables", {}).items()}
        return PlanSummary(plan_path, changes, resources, variables)

    def apply(self, plan: PlanSummary, stream: bool = True) -> None:
        """Apply exactly the saved plan the user saw (no re-plan in between)."""
        self._run("apply", str(plan.path), stream=stream, input=False)

    def destroy(self, var_file: Path | None = None, stream: bool = True) -> None:
        self._run(
            "destroy",
            stream=stream,
            input=False,
            auto_approve=IsFlagged,
            var_file=str(var_file) if var_file else None,
        )

    def outputs(self) -> dict:
        """All root outputs as plain values (`terraform output -json`)."""
        raw = json.loads(self._run("output", json=IsFlagged) or "{}")
        return {name: item["value"] for name, item in raw.items()}

    def has_state(self) -> bool:
        """Whether the stack currently manages any resource."""
        return bool(self.resources())

    def resources(self) -> list[str] | None:
        """The addresses of the resources the stack's state still holds (`terraform state list`); None when the
        state cannot be read."""
        with self._environment():
            code, out, _ = self.tf.cmd("state list", no_color=IsFlagged, capture_output=True)
        return out.split() if code == 0 else None


class _Kept:
    text = ""


@contextlib.contextmanager
def _kept_stderr():
    """python-terraform hands `sys.stderr` to the child when it does not capture: point it at a temporary file for
    the call, then show what it holds and keep its text."""
    kept = _Kept()
    console = sys.stderr
    with tempfile.TemporaryFile("w+") as file:
        sys.stderr = file
        try:
            yield kept
        finally:
            sys.stderr = console
            file.seek(0)
            kept.text = file.read()
            console.write(kept.text)
            console.flush()
