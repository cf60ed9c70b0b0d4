"""The job is declared once: every field reaches `invoke train --help`, the spec.json a run writes and
the workers' view of the job with the same name and value; training/ and observability/ never import
the launcher."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO
from tests.helpers.product import invoke
from training.common.job import BY_KEY, FIELDS, Job, fields_of, read_job

# A value other than the default for every option, in three jobs that together use them all.
WALKS = {
    "llama-local": {
        "model": "llama2-tiny",
        "layers": 3,
        "dataset": "org/dialogues",
        "dataset_split": "validation",
        "seq_len": 64,
        "steps": 7,
        "global_batch_size": 8,
        "micro_batch_size": 2,
        "lr": 0.002,
        "schedule": "constant",
        "warmup_steps": 2,
        "weight_decay": 0.01,
        "grad_clip": 0.5,
        "nodes": 2,
        "nproc": 1,
        "sharding": "SHARD_GRAD_OP",
        "precision": "fp32",
        "activation_checkpointing": True,
        "checkpoint_interval": 3,
        "keep_checkpoints": 3,
        "max_restarts": 1,
        "collective_timeout": 120,
        "rdzv": "etcd",
        "rdzv_endpoint": "127.0.0.1:2379",
        "run_id": "walk-llama",
        "seed": 7,
        "log_interval": 2,
        "metrics_port": 9500,
        "peak_tflops": 100.0,
        "hf_token_file": "/nonexistent/token",
        "target": "local",
    },
    "vision-local": {
        "model": "resnet-tiny",
        "image_size": 48,
        "synthetic": True,
        "loader_workers": 0,
        "optimizer": "lamb",
        "label_smoothing": 0.05,
        "warmup_epochs": 0.5,
        "steps": 5,
        "run_id": "walk-vision",
    },
    "llama-eks": {
        "model": "llama2-7b",
        "init": "pretrained",
        "weights": "meta-llama/Llama-2-7b-chat-hf",
        "epochs": 1,
        "target": "eks",
        "instance_type": "p4d.24xlarge",
        "image": "registry.example/trainkit:walk",
        "namespace": "walk-jobs",
        "nproc": 4,
        "run_id": "walk-eks",
        "runs_dir": "walk-runs",  # on FSx: relative to the mount
    },
}


def _command_line(values: dict) -> list[str]:
    args = []
    for key, value in values.items():
        spec = BY_KEY[key]
        if spec.switch:
            args.append(spec.flag)
        else:
            args += [spec.flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def _printed_job(result) -> dict:
    """The job a dry run printed: spec.json itself (local) or the pods' TRAINKIT_SPEC (EKS)."""
    assert result.returncode == 0, result.stderr
    if result.stdout.lstrip().startswith("{"):
        return json.loads(result.stdout)
    manifest = yaml.safe_load(result.stdout)
    container = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "TRAINKIT_SPEC"))


def test_the_walks_give_every_option_a_value():
    given = {key for values in WALKS.values() for key in values}
    assert given == {spec.key for spec in fields_of(cli=True)}


def test_every_option_is_in_the_help_with_its_declared_text():
    result = invoke("train", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for spec in fields_of(cli=True):
        assert spec.flag in text, spec.flag
        assert " ".join(spec.help.split()[:6]) in text, spec.flag


@pytest.mark.parametrize("walk", WALKS)
def test_every_field_reaches_spec_json_and_the_workers_view(walk, tmp_path):
    values = {"runs_dir": str(tmp_path / "runs"), **WALKS[walk]}
    result = invoke("train", *_command_line(values), "--dry-run", env={"TRAINKIT_STATE_DIR": str(tmp_path)})
    written = _printed_job(result)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(written))
    worker = read_job(path)  # what training.llm.train / training.vision.train start from
    for spec in FIELDS:
        section = written[spec.section]
        assert spec.name in section, f"{spec.path} missing from spec.json"
        assert spec.get(worker) == section[spec.name], spec.path
        if spec.key in values:
            assert section[spec.name] == values[spec.key], f"{spec.flag} {values[spec.key]!r} -> {spec.path}"
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_a_real_runs_spec_json_is_what_its_workers_read(tiny_run):
    written = json.loads((tiny_run / "spec.json").read_text())
    worker = read_job(tiny_run / "spec.json")
    assert worker.to_dict() == written
    assert worker.model.name == "llama2-tiny" and worker.run_dir.name == tiny_run.name


def test_an_earlier_flat_spec_json_is_still_read():
    flat = {"model": "llama2-7b", "steps": 10, "nproc": 8, "run_id": "old", "rdzv_endpoint": "h:1"}
    job = Job.from_dict(flat)
    assert (job.model.name, job.optimisation.steps, job.parallelism.nproc) == ("llama2-7b", 10, 8)
    assert (job.run.run_id, job.elastic.rdzv_endpoint) == ("old", "h:1")


def _importers_of(folder: Path, package: str) -> list[str]:
    """Files under `folder` that import `package` (absolute imports; relative ones stay inside)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            if package in names:
                found.append(str(path.relative_to(folder)))
                break
    return found


def test_imports_go_one_way():
    """training/ runs in the image without the launcher; observability/ is used by the launcher, never the
    other way round, so there is no cycle between the two packages."""
    assert _importers_of(REPO / "training", "trainkit") == []
    assert _importers_of(REPO / "observability", "trainkit") == []


def test_the_import_check_finds_a_planted_import(tmp_path):
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "a.py").write_text("import os\n\ndef f():\n    from trainkit.job import build\n")
    (tmp_path / "b.py").write_text("import trainkit.cluster as c\n")
    (tmp_path / "c.py").write_text("from . import trainkit\n")  # relative: a module of its own package
    assert _importers_of(tmp_path, "trainkit") == ["b.py", "deep/a.py"]


def test_the_launcher_starts_without_torch():
    """Every `invoke` command imports the launcher; torch (and Accelerate) load only in the workers, so
    `invoke --list`, `plan` and a dry run take a fraction of a second."""
    code = (
        "import sys, tasks, trainkit.backends.local, trainkit.backends.eks, trainkit.launch, trainkit.plan; "
        "print(sorted(m for m in ('torch', 'accelerate', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
