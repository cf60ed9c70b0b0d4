"""The job is declared once, seen from the command line: every field reaches `invoke train --help` and,
through a dry run, the spec.json a run writes and the workers' view of the job, with the same name and
value; the launcher's modules import without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.crd import schema_errors, webhook_errors
from tests.helpers.eks import dry_run_job
from tests.helpers.jobs import WALKS
from tests.helpers.paths import REPO
from tests.helpers.product import invoke
from training.spec import all_fields, by_key, fields_of, read_job


def _command_line(values: dict) -> list[str]:
    args = []
    for key, value in values.items():
        spec = by_key()[key]
        if spec.switch:
            args.append(spec.flag)
        else:
            args += [spec.flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def _printed_job(result) -> dict:
    """The job a dry run printed: spec.json itself (local), the pods' TRAINKIT_SPEC (EKS) or the spec.json the
    launch channel uploads (SageMaker)."""
    assert result.returncode == 0, result.stderr
    if result.stdout.lstrip().startswith("{"):
        printed = json.loads(result.stdout)
        if "request" in printed:
            return next(body for path, body in printed["uploads"].items() if path.endswith("/spec.json"))
        return printed
    manifest = dry_run_job(result.stdout)
    # the PyTorchJob the walk makes (LoRA's options and all) is one the operator's CRD and webhook accept
    assert schema_errors(manifest) == [] and webhook_errors(manifest) == []
    container = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "TRAINKIT_SPEC"))


def test_every_option_is_in_the_help_with_its_declared_text():
    result = invoke("train", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split()).replace("- ", "-")  # the help wraps after a word's hyphen too
    for spec in fields_of(cli=True):
        assert spec.flag in text, spec.flag
        assert " ".join(spec.help.split()[:6]).replace("- ", "-") in text, spec.flag


@pytest.mark.parametrize("walk", WALKS)
def test_every_field_reaches_spec_json_and_the_workers_view(walk, tmp_path):
    values = {"runs_dir": str(tmp_path / "runs"), **WALKS[walk]}
    if "hf_token_file" in values:  # an existing file: a missing one is refused
        values["hf_token_file"] = values["hf_token_file"].format(tmp=tmp_path)
        (tmp_path / "token").write_text("hf_walk_token_not_real\n")
    result = invoke("train", *_command_line(values), "--dry-run", env={"TRAINKIT_STATE_DIR": str(tmp_path)})
    written = _printed_job(result)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(written))
    worker = read_job(path)  # what `python -m training` starts from
    for spec in all_fields():
        section = written[spec.section]
        assert spec.name in section, f"{spec.path} missing from spec.json"
        assert spec.get(worker) == section[spec.name], spec.path
        if spec.key in values:
            assert section[spec.name] == values[spec.key], f"{spec.flag} {values[spec.key]!r} -> {spec.path}"
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_the_launcher_starts_without_torch():
    """Every `invoke` command imports the launcher; torch (and Accelerate) load only in the workers, so
    `invoke --list`, `plan` and a dry run take a fraction of a second. The families' launcher sides too
    (training/families.py `launch`), which the launcher imports to check and prepare a job."""
    code = (
        "import sys, tasks, trainkit.backends.local.backend, trainkit.backends.eks.backend, trainkit.run.prepare; "
        "import trainkit.plan.scaling, trainkit.workloads.nccl_test, trainkit.workloads.imagenet; "
        "from training.families import FAMILIES; [__import__(family.launch) for family in FAMILIES.values()]; "
        "print(sorted(m for m in ('torch', 'accelerate', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
