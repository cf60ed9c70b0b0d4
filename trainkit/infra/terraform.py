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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from python_terraform import IsFlagged, Terraform

from ..errors import SpecError
from .cli_config import write_cli_config


class TerraformError(RuntimeError):
    def __init__(self, command: str, code: int, stderr: str | None):
        detail = (stderr or "").strip().splitlines()
        super().__init__(f"terraform {command} failed (exit {code})" + (f": {detail[-1]}" if detail else ""))
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
        options.setdefault("no_color", IsFlagged)
        with self._environment():
            code, out, err = self.tf.cmd(command, *args, capture_output=not stream, **options)
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
        with self._environment():
            code, out, _ = self.tf.cmd("state list", no_color=IsFlagged, capture_output=True)
        return code == 0 and bool(out.strip())
