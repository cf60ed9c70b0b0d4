"""README's "On AWS (EKS)", as far as a machine without an AWS account can check it: the line that creates nothing
(the PyTorchJob `--dry-run` prints for the stack `make up` recorded) runs as written, and every other line is one
that named tests run against the emulators (moto, the local Kubernetes API server, buildah), so a command added to
the README without a test that runs it fails here. What only the cloud proves is marked cloud-only in docs/aws.md
and docs/eks.md."""

from __future__ import annotations

import yaml

from tests.helpers.paths import REPO
from tests.helpers.product import invoke_in

SECTION = "## On AWS (EKS)"
DRY_RUN = "invoke train --model llama2-7b --profile aws --nodes 2 --dry-run"
# README line (without its comment) -> (the test module that runs it, the words that module must use)
RUN_ELSEWHERE = {
    "cp terraform/stacks/infra/terraform.tfvars.example terraform/stacks/infra/terraform.tfvars": (
        "tests/integration/test_cli_errors.py",
        ("terraform.tfvars.example", "test_missing_tfvars_says_to_copy_the_example"),
    ),
    "$EDITOR terraform/stacks/infra/terraform.tfvars": None,  # the user's own values
    "invoke infra.plan": ("tests/integration/test_cli_errors.py", ("infra.plan",)),
    "make up PROFILE=aws": ("tests/helpers/infra_round_trip.py", ('"PROFILE=aws"', '_make("up"')),
    "invoke images.build && invoke images.push": ("tests/integration/test_images_cli.py", ("images.build", "push")),
    "invoke nccl-test --target eks --nodes 2": ("tests/e2e/test_nccl_test.py", ("nccl-test", "eks")),
    "invoke train --model llama2-7b --profile aws --nodes 2": ("tests/e2e/test_eks_backend_runs.py", ('"train"',)),
    "invoke status && invoke logs -f": ("tests/e2e/test_eks_backend_runs.py", ('"status"', '"logs"', '"-f"')),
    "make down PROFILE=aws": ("tests/helpers/infra_round_trip.py", ('"PROFILE=aws"', '_make("down"')),
}


def section_lines() -> list[str]:
    text = (REPO / "README.md").read_text().partition(SECTION)[2].partition("\n## ")[0]
    return [" ".join(line.split("#")[0].split()) for line in text.splitlines() if line.startswith("    ")]


def test_every_line_runs_here_or_in_a_named_test():
    lines = section_lines()
    assert DRY_RUN in lines
    unmapped = [line for line in lines if line != DRY_RUN and line not in RUN_ELSEWHERE]
    assert unmapped == [], "map each new README line to the test that runs it"
    for line in lines:
        where = RUN_ELSEWHERE.get(line)
        if where:
            module, words = where
            text = (REPO / module).read_text()
            assert all(word in text for word in words), (line, module)


def test_the_dry_run_line_runs_as_written_and_creates_nothing(recorded_outputs, tmp_path):
    done = invoke_in(tmp_path, *DRY_RUN.split()[1:])
    assert done.returncode == 0, done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout.partition("\n---\n")[2] or done.stdout) if d]
    job = next(d for d in documents if d.get("kind") == "PyTorchJob")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert not (tmp_path / "runs").exists()
