"""The command line: one Invoke collection per module (train: the job's doors at the top level; run: a user's
script; nccl_test: nccl-test; infra, data, images, obs, secrets; bench: chaos and benchmarks at the top level). The
repository's tasks.py exposes `namespace` to `invoke`; an installed package has the same commands as `trainkit` (or
`python -m trainkit`), which needs no tasks.py and no checkout."""

from __future__ import annotations

import sys

from invoke import Collection, Program

from training.families import load_family_modules

try:  # before the tasks' modules: a family module's models and options are flags of `invoke train`
    load_family_modules()
except ValueError as error:
    sys.exit(f"error: {error}")

from trainkit.cli import bench, data, generate, images, infra, nccl_test, obs, run, secrets, train  # noqa: E402

namespace = Collection(
    *train.TASKS,
    *bench.TASKS,
    *nccl_test.TASKS,
    *run.TASKS,
    *generate.TASKS,
    infra.collection,
    data.collection,
    images.collection,
    secrets.collection,
    obs.collection,
)


def main() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("trainkit")
    except PackageNotFoundError:
        installed = "unknown"
    Program(namespace=namespace, name="trainkit", binary="trainkit", version=installed).run()
